"""Retrieval tools: ``BM25SearchTool`` searches a local document set; ``SearchTool`` (verl's name, its search-R1
example) asks a retrieval service over HTTP.

``BM25SearchTool`` (``rank_bm25.BM25Okapi``, no service needed). Config: ``corpus_path`` (a ``.jsonl`` file with
one document per line under ``text`` or ``contents``, optional ``title``; or a ``.txt`` file with one document per
line) or ``documents`` (a list of strings in the yaml),
``top_k`` (default 3), ``max_chars_per_doc`` (default 500). The call is ``search(query)`` and returns the best
documents, numbered. Tokenisation: lower-cased words and numbers.

``SearchTool``. Config: ``retrieval_service_url`` (required), ``topk`` (3), ``timeout`` (seconds, 30),
``max_attempts`` (3), ``rate_limit`` (concurrent requests of this tool, 120). The call is
``search(query_list=[...])``; the service gets ``POST {"queries": [...], "topk": k, "return_scores": true}`` and
answers ``{"result": [[{"document": {"contents": "<title>\n<text>"}, "score": ...}, ...], ...]}`` (one list per
query, the format of verl's retrieval server). The model reads ``{"result": "Doc 1 (Title: ...)\n<text> ..."}``,
the queries' passages separated by ``---``, or ``{"result": "Search error: ..."}`` when the service fails.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import urllib.error
import urllib.request
from typing import Any, Optional

from rank_bm25 import BM25Okapi

from .base_tool import BaseTool
from .schemas import OpenAIFunctionToolSchema, ToolResponse

__all__ = ["BM25SearchTool", "SearchTool", "load_corpus", "tokenize", "passages_text"]

DEFAULT_SCHEMA = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the document collection and return the most relevant passages.",
        "parameters": {"type": "object",
                       "properties": {"query": {"type": "string", "description": "what to look for"}},
                       "required": ["query"]},
    },
}
_WORD = re.compile(r"\w+", re.UNICODE)


def tokenize(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def load_corpus(path: str) -> list[str]:
    """Documents from a ``.jsonl`` (``text`` / ``contents`` [+ ``title``]) or a ``.txt`` (one per line) file."""
    full = os.path.expanduser(path)
    if not os.path.isfile(full):
        raise FileNotFoundError(f"search tool config corpus_path={path}: no such file")
    docs = []
    with open(full, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            if full.endswith(".jsonl"):
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path} line {lineno} is not JSON: {exc}") from exc
                text = row.get("text", row.get("contents"))
                if text is None:
                    raise ValueError(f"{path} line {lineno} has neither 'text' nor 'contents'")
                docs.append(f"{row['title']}: {text}" if row.get("title") else str(text))
            else:
                docs.append(line)
    if not docs:
        raise ValueError(f"search tool corpus {path} has no documents")
    return docs


class BM25SearchTool(BaseTool):
    """``search(query)`` -> the ``top_k`` best BM25 passages (see the module docstring)."""

    def __init__(self, config: dict, tool_schema: Optional[OpenAIFunctionToolSchema] = None):
        if tool_schema is None:
            tool_schema = OpenAIFunctionToolSchema.model_validate(DEFAULT_SCHEMA)
        super().__init__(config, tool_schema)
        if self.config.get("corpus_path"):
            self.documents = load_corpus(str(self.config["corpus_path"]))
        elif self.config.get("documents"):
            self.documents = [str(d) for d in self.config["documents"]]
        else:
            raise ValueError("search tool: set config.corpus_path (jsonl/txt) or config.documents (a list)")
        self.top_k = int(self.config.get("top_k", 3))
        self.max_chars = int(self.config.get("max_chars_per_doc", 500))
        self.index = BM25Okapi([tokenize(d) for d in self.documents])

    def search(self, query: str) -> list[tuple[int, float]]:
        """(document index, score) of the best matches with a positive score, best first."""
        scores = self.index.get_scores(tokenize(query))
        order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))[: self.top_k]
        return [(i, float(scores[i])) for i in order if scores[i] > 0]

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs):
        query = parameters.get("query")
        if not isinstance(query, str) or not query.strip():
            return ToolResponse(text="Error: missing argument 'query' (a string)"), 0.0, {"error": 1}
        hits = self.search(query)
        if not hits:
            return ToolResponse(text="No results."), 0.0, {"error": 0, "num_hits": 0}
        text = "\n".join(f"[{rank}] {self.documents[i][: self.max_chars]}" for rank, (i, _) in enumerate(hits, 1))
        return ToolResponse(text=text), 0.0, {"error": 0, "num_hits": len(hits)}


SERVICE_SCHEMA = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Searches the web for relevant information based on the given query.",
        "parameters": {"type": "object",
                       "properties": {"query_list": {"type": "array", "items": {"type": "string"},
                                                     "description": "the queries to search for"}},
                       "required": ["query_list"]},
    },
}


def passages_text(passages: list) -> str:
    """One query's retrieved passages as the model reads them: ``Doc i (Title: <first line>)`` then the rest."""
    out = []
    for i, item in enumerate(passages, 1):
        contents = str((item.get("document") or {}).get("contents", "")) if isinstance(item, dict) else str(item)
        title, _, text = contents.partition("\n")
        out.append(f"Doc {i} (Title: {title})\n{text}")
    return "\n\n".join(out)


class SearchTool(BaseTool):
    """``search(query_list)`` against a retrieval service (see the module docstring)."""

    def __init__(self, config: dict, tool_schema: Optional[OpenAIFunctionToolSchema] = None):
        if tool_schema is None:
            tool_schema = OpenAIFunctionToolSchema.model_validate(SERVICE_SCHEMA)
        super().__init__(config, tool_schema)
        self.url = str(self.config.get("retrieval_service_url") or "")
        if not self.url:
            raise ValueError("search tool: config.retrieval_service_url is not set (the retrieval service's "
                             "endpoint, e.g. http://127.0.0.1:8000/retrieve)")
        self.topk = int(self.config.get("topk", 3))
        self.timeout = float(self.config.get("timeout", 30))
        self.max_attempts = max(1, int(self.config.get("max_attempts", 3)))
        self._slots = asyncio.Semaphore(max(1, int(self.config.get("rate_limit", 120))))

    def _post(self, queries: list[str]) -> dict:
        body = json.dumps({"queries": queries, "topk": self.topk, "return_scores": True}).encode()
        request = urllib.request.Request(self.url, data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=self.timeout) as response:
            return json.loads(response.read().decode())

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs):
        queries = parameters.get("query_list")
        if isinstance(queries, str):
            queries = [queries]
        if not isinstance(queries, list) or not queries or not all(isinstance(q, str) for q in queries):
            return ToolResponse(text=json.dumps({"result": "Search error: query_list must be a non-empty list of "
                                                           "strings"})), 0.0, {"error": 1}
        error = ""
        async with self._slots:
            for _ in range(self.max_attempts):
                try:
                    answer = await asyncio.to_thread(self._post, queries)
                    break
                except (urllib.error.URLError, OSError, ValueError) as exc:
                    error = str(getattr(exc, "reason", exc))
            else:
                return ToolResponse(text=json.dumps({"result": f"Search error: {error}"})), 0.0, {"error": 1}
        results = answer.get("result") or []
        if not any(results):
            return ToolResponse(text=json.dumps({"result": "No search results found."})), 0.0, \
                {"error": 0, "num_hits": 0}
        text = "\n---\n".join(passages_text(r if isinstance(r, list) else [r]) for r in results)
        hits = sum(len(r) if isinstance(r, list) else 1 for r in results)
        return ToolResponse(text=json.dumps({"result": text}, ensure_ascii=False)), 0.0, {"error": 0, "num_hits": hits}
