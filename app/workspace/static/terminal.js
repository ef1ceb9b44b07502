// The web terminal: xterm.js on the agent's pty websocket. The reconnect id lives in
// sessionStorage, so a reload or a dropped connection re-attaches to the same shell
// (the agent replays its recent output); a new tab gets a shell of its own.
(function () {
  "use strict";
  const element = document.getElementById("terminal");
  const status = document.getElementById("terminal-status");
  const agentId = element.dataset.agentId;
  const storageKey = "workspace-terminal:" + agentId;
  let reconnect = sessionStorage.getItem(storageKey);
  if (!reconnect) {
    reconnect = crypto.randomUUID();
    sessionStorage.setItem(storageKey, reconnect);
  }
  const term = new Terminal({ cursorBlink: true, scrollback: 5000 });
  const fit = new FitAddon.FitAddon();
  term.loadAddon(fit);
  term.open(element);
  fit.fit();

  let socket = null;
  let delay = 500;

  function send(message) {
    if (socket && socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify(message));
  }

  function connect() {
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    const query = new URLSearchParams({ reconnect: reconnect, width: term.cols, height: term.rows });
    socket = new WebSocket(`${scheme}//${location.host}/api/v2/workspaceagents/${agentId}/pty?${query}`);
    socket.binaryType = "arraybuffer";
    socket.onopen = () => { status.textContent = "connected"; delay = 500; term.reset(); };
    socket.onmessage = (event) => term.write(new Uint8Array(event.data));
    socket.onclose = (event) => {
      status.textContent = `disconnected (${event.reason || event.code}); retrying…`;
      setTimeout(connect, delay);
      delay = Math.min(delay * 2, 10000);
    };
  }

  term.onData((data) => send({ data: data }));
  term.onResize((size) => send({ height: size.rows, width: size.cols }));
  window.addEventListener("resize", () => fit.fit());
  connect();
})();
