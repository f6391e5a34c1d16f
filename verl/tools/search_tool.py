"""A local retrieval tool: BM25 (``rank_bm25.BM25Okapi``) over a document set, no search service needed.

Config: ``corpus_path`` (a ``.jsonl`` file with one document per line under ``text`` or ``contents``, optional
``title``; or a ``.txt`` file with one document per line) or ``documents`` (a list of strings in the yaml),
``top_k`` (default 3), ``max_chars_per_doc`` (default 500). The call is ``search(query)`` and returns the best
documents, numbered. Tokenisation: lower-cased words and numbers.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Optional

from rank_bm25 import BM25Okapi

from .base_tool import BaseTool
from .schemas import OpenAIFunctionToolSchema, ToolResponse

__all__ = ["BM25SearchTool", "load_corpus", "tokenize"]

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
