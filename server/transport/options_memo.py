"""Compile requests converted once: an agent sends the same CompileRequest at every step,
and converting it (route, enums, limits, the options value) costs more than the lookup
of an unchanged view's repeat it asks for. Keyed by the request's deterministic
encoding, so equal requests share one frozen CompileOptions; only valid requests are
kept (a refused one is converted, and refused, each time). In memory, bounded. Shared
by the unary Compile and every CompileStream."""

from __future__ import annotations

from collections import OrderedDict

from ctxcc.v1 import compile_service_pb2
from server.service.compile_records import checked as checked_options
from server.service.compile_types import CompileOptions
from server.transport.convert_view import compile_options_in

# Requests over this size (a long working directory, say) are converted without keeping.
_MAX_KEY_BYTES = 2048


class OptionsMemo:
    def __init__(self, max_entries: int = 256) -> None:
        self._kept: OrderedDict[bytes, CompileOptions] = OrderedDict()
        self._max = max_entries

    def options(self, request: compile_service_pb2.CompileRequest) -> CompileOptions:
        key = request.SerializeToString(deterministic=True)
        if len(key) > _MAX_KEY_BYTES:
            return compile_options_in(request)
        found = self._kept.get(key)
        if found is not None:
            self._kept.move_to_end(key)
            return found
        found = compile_options_in(request)
        self._kept[key] = found
        if len(self._kept) > self._max:
            self._kept.popitem(last=False)
        return found

    def checked(self, request: compile_service_pb2.CompileRequest) -> CompileOptions:
        """The options with the request's own checks made (refused as `checked_options`
        refuses): a stream step makes them before its usage report and its append."""
        return checked_options(self.options(request))
