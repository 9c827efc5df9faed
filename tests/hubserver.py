"""A Hugging Face Hub on 127.0.0.1: enough of the protocol for the real ``huggingface_hub`` client
to create model and dataset repos and branches, list their files, upload (preupload answers
"regular", so contents arrive in the NDJSON commit), validate card metadata, keep collections,
and for ``transformers`` to download.

Repos live in memory: ``repos[repo_id][branch]`` is the list of commits, each
``{"oid", "message", "files": {path: bytes}}`` holding the whole tree; a dataset's key is
``datasets/<repo_id>``. ``collections[slug]`` is ``{"title", "owner", "private", "description",
"items": [{"_id", "id", "type", "note"}]}`` in order. ``fail_commits`` is a list of HTTP statuses
the next commits answer with (one each), ``fail_always`` a status every commit answers with,
``fail_repos`` the repos (keys as in ``repos``) whose every commit answers 500. ``requests`` logs
every (method, path); ``changes()`` those that change something.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlparse

import yaml

# What the Hub's metadata validation accepts, for the keys our cards use (a subset of its lists).
LICENSES = {"apache-2.0", "mit", "cc-by-4.0", "cc-by-sa-4.0", "cc0-1.0", "bsd-3-clause", "gpl-3.0", "other", "unknown"}
TASKS = {"text-generation", "text-classification", "question-answering", "summarization", "translation", "other"}
SIZES = {"n<1K", "1K<n<10K", "10K<n<100K", "100K<n<1M", "1M<n<10M", "10M<n<100M", "100M<n<1B", "n>1T"}
# Requests that change nothing although they are POSTs.
READ_ONLY_POSTS = ("/preupload/", "/api/validate-yaml")


class HubServer:
    def __init__(self):
        self.repos: dict[str, dict[str, list[dict]]] = {}
        self.private: dict[str, bool] = {}
        self.fail_commits: list[int] = []
        self.fail_always: int | None = None
        self.fail_repos: set[str] = set()
        self.collections: dict[str, dict] = {}
        self.ids = itertools.count(1)
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

    def changes(self) -> list[tuple[str, str]]:
        """The requests that change something on the Hub (every one but reads, preuploads and validations)."""
        return [
            (method, path)
            for method, path in self.requests
            if method not in ("GET", "HEAD") and not any(part in path for part in READ_ONLY_POSTS)
        ]

    def commits(self) -> int:
        """How many commits all repos hold."""
        return sum(len(commits) for branches in self.repos.values() for commits in branches.values())


def _oid(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()


def git_blob_oid(data: bytes) -> str:
    """A file's id as git (and the Hub's tree listing) gives it."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def metadata_problems(content: str, repo_type: str) -> list[str]:
    """What the Hub's YAML validation would refuse in a card's front matter."""
    match = re.match(r"^---\n(.*?)\n---\n", content, re.S)
    if not match:
        return ["no YAML front matter"]
    try:
        meta = yaml.safe_load(match.group(1))
    except yaml.YAMLError as e:
        return [f"invalid YAML: {e}"]
    if not isinstance(meta, dict):
        return ["the metadata is not a mapping"]
    problems = []

    def strings(key, allowed=None):
        value = meta.get(key)
        if value is None:
            return
        values = value if isinstance(value, list) else [value]
        if not all(isinstance(v, str) for v in values):
            problems.append(f"{key}: must be a string or a list of strings")
        elif allowed is not None and not set(values) <= allowed:
            problems.append(f"{key}: {sorted(set(values) - allowed)} not allowed")

    strings("license", LICENSES)
    strings("tags")
    if repo_type == "dataset":
        strings("task_categories", TASKS)
        strings("size_categories", SIZES)
        strings("pretty_name")
        configs = meta.get("configs", [])
        if not isinstance(configs, list) or not all(
            isinstance(c, dict) and isinstance(c.get("config_name"), str) and c.get("data_files") for c in configs
        ):
            problems.append("configs: each needs a config_name and data_files")
    else:
        strings("pipeline_tag", TASKS)
        strings("library_name")
        strings("datasets")
    return problems


def collection_json(slug: str, c: dict) -> dict:
    return {
        "slug": slug,
        "title": c["title"],
        "owner": {"name": c["owner"]},
        "description": c["description"],
        "private": c["private"],
        "items": [
            {"_id": i["_id"], "id": i["id"], "type": i["type"], "position": n, "note": {"text": i["note"]}}
            for n, i in enumerate(c["items"])
        ],
        "lastUpdated": "2026-12-01T00:00:00.000Z",
        "position": 0,
        "theme": "blue",
        "upvotes": 0,
    }


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
            url = urlparse(self.path)
            path, query = unquote(url.path), parse_qs(url.query)
            with hub.lock:
                hub.requests.append((method, path))
                if self.headers.get("Authorization"):
                    hub.authorization.add(self.headers["Authorization"])
            parts = path.strip("/").split("/")
            body = self.body() if method in ("POST", "PATCH", "PUT", "DELETE") else b""
            if method == "POST" and path == "/api/repos/create":
                return self.create_repo(json.loads(body))
            if method == "POST" and path == "/api/validate-yaml":
                req = json.loads(body)
                problems = metadata_problems(req["content"], req.get("repoType", "model"))
                return self.reply(400, "; ".join(problems).encode()) if problems else self.reply(200, {"warnings": []})
            if parts[:2] == ["api", "collections"]:
                return self.collection(method, parts[2:], query, json.loads(body) if body else {})
            if parts[:1] == ["api"] and parts[1:2] in (["models"], ["datasets"]) and len(parts) >= 4:
                key = "/".join(parts[2:4]) if parts[1] == "models" else "datasets/" + "/".join(parts[2:4])
                return self.api(method, key, parts[4:], body)
            if len(parts) >= 5 and parts[2] == "resolve":
                return self.resolve(method, "/".join(parts[:2]), parts[3], "/".join(parts[4:]))
            if len(parts) >= 6 and parts[0] == "datasets" and parts[3] == "resolve":
                return self.resolve(method, "/".join(parts[:3]), parts[4], "/".join(parts[5:]))
            self.reply(404, {"error": f"not served: {method} {path}"}, {"X-Error-Code": "EntryNotFound"})

        def create_repo(self, req: dict):
            repo_id = f"{req['organization']}/{req['name']}" if req.get("organization") else req["name"]
            key = repo_id if req.get("type", "model") == "model" else f"{req['type']}s/{repo_id}"
            with hub.lock:
                if key in hub.repos:
                    return self.reply(409, {"error": "You already created this repo", "url": f"{hub.url}/{key}"})
                commit = {"oid": _oid(key.encode()), "message": "initial commit", "files": {}}
                hub.repos[key] = {"main": [commit]}
                hub.private[key] = bool(req.get("private")) or req.get("visibility") == "private"
            self.reply(200, {"url": f"{hub.url}/{key}", "name": repo_id})

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
                return self.tree(repo_id, rest[1], "/".join(rest[2:]))
            self.reply(404, {"error": f"not served: {method} {rest}"}, {"X-Error-Code": "EntryNotFound"})

        def tree(self, repo_id: str, revision: str, folder: str):
            """Every file of a revision under ``folder`` (recursive: the client asks for that)."""
            head = hub.find(repo_id, revision)
            inside = {
                p: d for p, d in (head or {}).get("files", {}).items() if p.startswith(folder + "/" if folder else "")
            }
            if head is None or (folder and not inside):
                return self.reply(404, {"error": "Entry not found"}, {"X-Error-Code": "EntryNotFound"})
            entries = [
                {"type": "file", "path": p, "size": len(d), "oid": git_blob_oid(d)} for p, d in sorted(inside.items())
            ]
            self.reply(200, entries)

        def collection(self, method: str, rest: list[str], query: dict, req: dict):
            """POST /api/collections; GET /api/collections?owner=; GET|DELETE /api/collections/<slug>;
            POST /api/collections/<slug>/items; PATCH|DELETE /api/collections/<slug>/items/<_id>."""
            slug = "/".join(rest[:2])
            if method == "POST" and not rest:
                with hub.lock:
                    for existing, c in hub.collections.items():
                        if (c["owner"], c["title"]) == (req["namespace"], req["title"]):
                            return self.reply(409, {"error": "Collection already exists", "slug": existing})
                    words = re.sub(r"[^a-z0-9]+", "-", req["title"].lower()).strip("-")
                    slug = f"{req['namespace']}/{words}-{next(hub.ids):024x}"
                    hub.collections[slug] = {
                        "title": req["title"],
                        "owner": req["namespace"],
                        "private": bool(req.get("private")),
                        "description": req.get("description"),
                        "items": [],
                    }
                return self.reply(200, collection_json(slug, hub.collections[slug]))
            if method == "GET" and not rest:
                owner = query.get("owner", [None])[0]
                found = [
                    {k: v for k, v in collection_json(slug, c).items() if k != "position"}  # the list has none
                    for slug, c in hub.collections.items()
                    if owner in (None, c["owner"])
                ]
                return self.reply(200, found)
            if slug not in hub.collections:
                return self.reply(404, {"error": "Collection not found"}, {"X-Error-Code": "EntryNotFound"})
            c = hub.collections[slug]
            if method == "GET" and len(rest) == 2:
                return self.reply(200, collection_json(slug, c))
            if method == "POST" and rest[2:] == ["items"]:
                item = req["item"]
                key = item["id"] if item["type"] == "model" else f"{item['type']}s/{item['id']}"
                if key not in hub.repos:
                    return self.reply(404, {"error": f"{item['type']} {item['id']} not found"})
                if any((i["id"], i["type"]) == (item["id"], item["type"]) for i in c["items"]):
                    return self.reply(409, {"error": "Item already in the collection"})
                with hub.lock:
                    c["items"].append({"_id": f"{next(hub.ids):024x}", **item, "note": req.get("note")})
                return self.reply(200, collection_json(slug, c))
            index = next((n for n, i in enumerate(c["items"]) if rest[3:4] == [i["_id"]]), None)
            if rest[2:3] == ["items"] and index is not None and method == "PATCH":
                with hub.lock:
                    item = c["items"].pop(index)
                    item["note"] = req.get("note", item["note"])
                    c["items"].insert(req.get("position", index), item)
                return self.reply(200, {"success": True})
            if rest[2:3] == ["items"] and index is not None and method == "DELETE":
                with hub.lock:
                    c["items"].pop(index)
                return self.reply(200, {"success": True})
            self.reply(404, {"error": f"not served: {method} {rest}"}, {"X-Error-Code": "EntryNotFound"})

        def commit(self, repo_id: str, branch: str, body: bytes):
            with hub.lock:
                status = hub.fail_always or (hub.fail_commits.pop(0) if hub.fail_commits else None)
                status = status or (500 if repo_id in hub.fail_repos else None)
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

        def do_PATCH(self):
            self.route("PATCH")

        def do_DELETE(self):
            self.route("DELETE")

    return Handler
