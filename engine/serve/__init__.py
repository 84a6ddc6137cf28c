"""`aural serve`: Aural behind OpenAI's audio API and a WebSocket for live audio, on FastAPI and uvicorn
(the usual pair for Python HTTP services: request parsing, multipart uploads, body limits, WebSockets and
OpenAPI docs come from them, not from code of ours). Needs the `serve` extra: pip install 'aural[serve]'.

`app` holds the routes, `registry` the models and the stream slots, `responses` OpenAI's response formats,
`live` the WebSocket, `telemetry` the Prometheus metrics.
"""

from .app import ServeConfig, create_app

__all__ = ["ServeConfig", "create_app"]
