"""Typed keys of what the web application shares with its handlers."""

from __future__ import annotations

import asyncio

import jinja2
from aiohttp import web

from server.service.inspection import InspectUseCases

INSPECT = web.AppKey("inspect", InspectUseCases)
TEMPLATES = web.AppKey("templates", jinja2.Environment)
# Streamed answers send their headers before the boundary middleware sees them.
HEADERS = web.AppKey("security_headers", dict[str, str])
# The pages being made at once (PAGES_AT_ONCE): the others wait their turn.
BUILDING = web.AppKey("building", asyncio.Semaphore)
