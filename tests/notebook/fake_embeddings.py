"""A local stand-in for an OpenAI-compatible embeddings API (POST /v1/embeddings,
the real request and answer shapes), for the `openai` provider's tests. Its
vectors are bags of hashed words: texts sharing words are similar."""
import hashlib
import http.server
import json
import math
import threading

DIMENSIONS = 64


def vector(text):
    values = [0.0] * DIMENSIONS
    for word in text.lower().split():
        word = "".join(ch for ch in word if ch.isalnum())
        if word:
            values[int(hashlib.sha256(word.encode()).hexdigest(), 16) % DIMENSIONS] += 1.0
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return [v / norm for v in values]


class Handler(http.server.BaseHTTPRequestHandler):
    requests_seen = []

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.requests_seen.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
        if self.path != "/v1/embeddings" or self.headers.get("Authorization") != "Bearer sk-test":
            self.send_response(401)
            self.end_headers()
            return
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        answer = json.dumps({"object": "list", "model": body["model"],
                             "data": [{"object": "embedding", "index": i, "embedding": vector(t)}
                                      for i, t in enumerate(inputs)]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)


def start():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    server.base_url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.seen = Handler.requests_seen
    return server
