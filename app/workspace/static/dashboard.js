// Live agent status on the dashboard: an SSE stream of {agent_id, status}; the
// browser's EventSource reconnects by itself and the stream starts with a snapshot.
(function () {
  "use strict";
  const events = new EventSource("/api/v2/users/me/workspaces/watch");
  events.onmessage = (event) => {
    const change = JSON.parse(event.data);
    const badge = document.querySelector(`[data-agent-id="${change.agent_id}"]`);
    if (badge) {
      badge.textContent = change.status;
      badge.className = "status " + change.status;
    }
  };
})();
