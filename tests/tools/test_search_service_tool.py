"""SearchTool (verl's search-R1 tool) against a real local HTTP retrieval service: the request it sends, the
passages the model reads, a service that is down, and bad arguments."""

import asyncio
import json
import textwrap
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from verl.tools.search_tool import SearchTool
from verl.tools.utils.tool_registry import initialize_tools_from_config

DOCS = {"capital of france": [{"document": {"contents": "Paris\nParis is the capital of France."}, "score": 9.1},
                              {"document": {"contents": "France\nA country in Europe."}, "score": 3.2}],
        "tallest mountain": [{"document": {"contents": "Everest\n8,849 m above sea level."}, "score": 7.0}]}


@pytest.fixture
def service():
    requests = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 -- http.server's name
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            requests.append(body)
            answer = {"result": [DOCS.get(q, [])[: body["topk"]] for q in body["queries"]]}
            data = json.dumps(answer).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/retrieve", requests
    server.shutdown()


def test_queries_go_to_the_service_and_the_passages_come_back_numbered(service, tmp_path):
    url, requests = service
    path = tmp_path / "search_tool_config.yaml"  # verl's examples/sglang_multiturn/config/tool_config entry
    path.write_text(textwrap.dedent(f"""
        tools:
          - class_name: verl.tools.search_tool.SearchTool
            config: {{retrieval_service_url: {url}, num_workers: 120, rate_limit: 120, timeout: 30, type: native}}
            tool_schema:
              type: function
              function:
                name: search
                parameters: {{type: object, properties: {{query_list: {{type: array, item: {{type: string}}}}}},
                             required: [query_list]}}
    """))
    [tool] = initialize_tools_from_config(str(path))
    assert isinstance(tool, SearchTool) and tool.name == "search"
    response, reward, metrics = asyncio.run(tool.execute("i", {"query_list": ["capital of france",
                                                                              "tallest mountain"]}))
    assert requests == [{"queries": ["capital of france", "tallest mountain"], "topk": 3, "return_scores": True}]
    assert json.loads(response.text)["result"] == (
        "Doc 1 (Title: Paris)\nParis is the capital of France.\n\nDoc 2 (Title: France)\nA country in Europe."
        "\n---\nDoc 1 (Title: Everest)\n8,849 m above sea level.")
    assert reward == 0.0 and metrics == {"error": 0, "num_hits": 3}
    nothing = asyncio.run(tool.execute("i", {"query_list": ["unknown"]}))
    assert json.loads(nothing[0].text)["result"] == "No search results found."


def test_a_service_that_is_down_and_bad_arguments_become_messages_to_the_model():
    down = SearchTool({"retrieval_service_url": "http://127.0.0.1:9/retrieve", "timeout": 2, "max_attempts": 2})
    response, _, metrics = asyncio.run(down.execute("i", {"query_list": ["x"]}))
    assert json.loads(response.text)["result"].startswith("Search error:") and metrics == {"error": 1}
    bad = asyncio.run(down.execute("i", {"query_list": [1, 2]}))
    assert "query_list must be a non-empty list of strings" in bad[0].text
    with pytest.raises(ValueError, match="config.retrieval_service_url is not set"):
        SearchTool({})
