"""A Hugging Face Hub on 127.0.0.1, standard library only: enough of the protocol for the real
``huggingface_hub`` client to create repos and branches, upload (preupload answers "regular",
so contents arrive in the NDJSON commit), and for ``transformers`` to download.

Repos live in memory: ``repos[repo_id][branch]`` is the list of commits, each
``{"oid", "message", "files": {path: bytes}}`` holding the whole tree. ``fail_commits`` is a
list of HTTP statuses the next commits answer with (one each), ``fail_always`` a status every
commit answers with. ``requests`` logs every (method, path).
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse


class HubServer:
    def __init__(self):
        self.repos: dict[str, dict[str, list[dict]]] = {}
        self.private: dict[str, bool] = {}
        self.fail_commits: list[int] = []
        self.fail_always: int | None = None
        self.requests: list[tuple[str, str]] = []
        self.authorization: set[str] = set()  # every Authorization header seen
        self.lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()

    def head(self, repo_id: str, branch: str = "main") -> dict | None:
        commits = self.repos.get(repo_id, {}).get(branch)
        return commits[-1] if commits else None

    def find(self, repo_id: str, revision: str) -> dict | None:
        """The commit a branch name or a commit id names."""
        return self.head(repo_id, revision) or next(
            (c for commits in self.repos.get(repo_id, {}).values() for c in commits if c["oid"] == revision), None
        )

    def files(self, repo_id: str, branch: str = "main") -> dict[str, bytes]:
        head = self.head(repo_id, branch)
        return dict(head["files"]) if head else {}


def _oid(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()


def _handler(hub: HubServer):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def reply(self, status: int, body=b"", headers: dict | None = None):
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(status)
            content_type = "application/json" if not isinstance(body, bytes) else "application/octet-stream"
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            if self.command != "HEAD":  # a HEAD answer has the headers of the GET one, no body
                self.wfile.write(data)

        def body(self) -> bytes:
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def route(self, method: str):
            path = unquote(urlparse(self.path).path)
            with hub.lock:
                hub.requests.append((method, path))
                if self.headers.get("Authorization"):
                    hub.authorization.add(self.headers["Authorization"])
            parts = path.strip("/").split("/")
            body = self.body() if method == "POST" else b""
            if method == "POST" and path == "/api/repos/create":
                return self.create_repo(json.loads(body))
            if method == "POST" and path == "/api/validate-yaml":
                return self.reply(200, {"warnings": []})
            if parts[:2] == ["api", "models"] and len(parts) >= 4:
                return self.api(method, "/".join(parts[2:4]), parts[4:], body)
            if len(parts) >= 5 and parts[2] == "resolve":
                return self.resolve(method, "/".join(parts[:2]), parts[3], "/".join(parts[4:]))
            self.reply(404, {"error": f"not served: {method} {path}"}, {"X-Error-Code": "EntryNotFound"})

        def create_repo(self, req: dict):
            repo_id = f"{req['organization']}/{req['name']}" if req.get("organization") else req["name"]
            with hub.lock:
                if repo_id in hub.repos:
                    return self.reply(
                        409, {"error": "You already created this model repo", "url": f"{hub.url}/{repo_id}"}
                    )
                commit = {"oid": _oid(repo_id.encode()), "message": "initial commit", "files": {}}
                hub.repos[repo_id] = {"main": [commit]}
                hub.private[repo_id] = bool(req.get("private"))
            self.reply(200, {"url": f"{hub.url}/{repo_id}", "name": repo_id})

        def api(self, method: str, repo_id: str, rest: list[str], body: bytes):
            if repo_id not in hub.repos:
                return self.reply(404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})
            branches = hub.repos[repo_id]
            if method == "POST" and rest[:1] == ["branch"]:
                branch = "/".join(rest[1:])
                if branch in branches:
                    return self.reply(409, {"error": "Reference already exists"})
                with hub.lock:
                    branches[branch] = [dict(branches["main"][-1])]
                return self.reply(200, {})
            if method == "POST" and rest[:1] == ["preupload"]:
                files = json.loads(body)["files"]
                return self.reply(
                    200, {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]}
                )
            if method == "POST" and rest[:1] == ["commit"]:
                return self.commit(repo_id, "/".join(rest[1:]), body)
            if method == "GET" and rest[:1] in ([], ["revision"]):
                branch = "/".join(rest[1:]) or "main"
                return self.info(repo_id, branch)
            if method == "GET" and rest[:1] == ["tree"]:
                head = hub.find(repo_id, rest[1])
                if head is None or len(rest) > 2:  # no such revision, or a folder (there are none)
                    return self.reply(404, {"error": "Entry not found"}, {"X-Error-Code": "EntryNotFound"})
                return self.reply(
                    200,
                    [
                        {"type": "file", "path": p, "size": len(d), "oid": _oid(d)}
                        for p, d in sorted(head["files"].items())
                    ],
                )
            self.reply(404, {"error": f"not served: {method} {rest}"}, {"X-Error-Code": "EntryNotFound"})

        def commit(self, repo_id: str, branch: str, body: bytes):
            with hub.lock:
                status = hub.fail_always or (hub.fail_commits.pop(0) if hub.fail_commits else None)
            if status:
                return self.reply(status, {"error": f"injected failure {status}"})
            if branch not in hub.repos[repo_id]:
                return self.reply(404, {"error": f"Invalid rev id: {branch}"}, {"X-Error-Code": "RevisionNotFound"})
            lines = [json.loads(line) for line in body.splitlines() if line.strip()]
            with hub.lock:
                files = dict(hub.repos[repo_id][branch][-1]["files"])
                for item in lines:
                    if item["key"] == "file":
                        files[item["value"]["path"]] = base64.b64decode(item["value"]["content"])
                    elif item["key"] in ("deletedFile",):
                        files.pop(item["value"]["path"], None)
                message = next(i["value"]["summary"] for i in lines if i["key"] == "header")
                oid = _oid(
                    json.dumps([repo_id, branch, message, sorted(files)]).encode()
                    + str(len(hub.repos[repo_id][branch])).encode()
                )
                hub.repos[repo_id][branch].append({"oid": oid, "message": message, "files": files})
            self.reply(
                200,
                {
                    "commitUrl": f"{hub.url}/{repo_id}/commit/{oid}",
                    "commitOid": oid,
                    "pullRequestUrl": None,
                    "success": True,
                },
            )

        def info(self, repo_id: str, branch: str):
            head = hub.find(repo_id, branch)
            if head is None:
                return self.reply(404, {"error": "Invalid rev id"}, {"X-Error-Code": "RevisionNotFound"})
            self.reply(
                200,
                {
                    "id": repo_id,
                    "modelId": repo_id,
                    "sha": head["oid"],
                    "private": hub.private[repo_id],
                    "siblings": [{"rfilename": p} for p in sorted(head["files"])],
                    "tags": [],
                },
            )

        def resolve(self, method: str, repo_id: str, revision: str, filename: str):
            if repo_id not in hub.repos:
                return self.reply(404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})
            head = hub.find(repo_id, revision)
            if head is None:
                return self.reply(404, {"error": "Invalid rev id"}, {"X-Error-Code": "RevisionNotFound"})
            if filename not in head["files"]:
                return self.reply(
                    404, {"error": "Entry not found"}, {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": head["oid"]}
                )
            data = head["files"][filename]
            self.reply(200, data, {"ETag": f'"{_oid(data)}"', "X-Repo-Commit": head["oid"]})

        def do_GET(self):
            self.route("GET")

        def do_HEAD(self):
            self.route("HEAD")

        def do_POST(self):
            self.route("POST")

    return Handler
