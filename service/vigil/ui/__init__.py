"""The reviewer web UI: server-rendered pages (Jinja2, autoescaped), a little plain JS and CSS."""
