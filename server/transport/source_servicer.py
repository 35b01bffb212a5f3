"""ctxcc.v1.SourceService: memory, rules and skills over the API, and LoadRule."""

from __future__ import annotations

from typing import Any

import grpc

from ctxcc.v1 import common_pb2, source_pb2
from ctxcc.v1 import source_service_pb2 as pb
from ctxcc.v1 import source_service_pb2_grpc as pb_grpc
from server.compiler.textscan import MAX_GLOBS
from server.domain.errors import invalid
from server.domain.sources import (
    MemoryEntry,
    RuleActivation,
    RuleEntry,
    Scope,
    SkillEntry,
    SourceKind,
)
from server.service.sources import SourceUseCases
from server.transport.convert_events import timestamp
from server.transport.errors import unary
from server.transport.paging import check_fits

Ctx = grpc.aio.ServicerContext[Any, Any]


def scope_in(value: int, *, required: bool) -> Scope | None:
    if value == 0 and not required:
        return None
    if value not in {int(s) for s in Scope}:
        raise invalid("scope", "scope must be GLOBAL, PROJECT or SESSION")
    return Scope(value)


def _scope_out(scope: Scope) -> common_pb2.Scope.ValueType:
    return common_pb2.Scope.ValueType(int(scope))


def memory_out(m: MemoryEntry) -> source_pb2.MemoryEntry:
    return source_pb2.MemoryEntry(
        memory_id=m.memory_id,
        scope=_scope_out(m.scope),
        scope_id=m.scope_id,
        text=m.text,
        update_time=timestamp(m.update_time_ns),
        source=m.origin,
    )


def rule_out(r: RuleEntry) -> source_pb2.Rule:
    return source_pb2.Rule(
        rule_id=r.rule_id,
        scope=_scope_out(r.scope),
        scope_id=r.scope_id,
        name=r.name,
        description=r.description,
        text=r.text,
        activation=source_pb2.RuleActivation.ValueType(int(r.activation)),
        path_globs=list(r.path_globs),
        update_time=timestamp(r.update_time_ns),
        source=r.origin,
    )


def skill_out(s: SkillEntry) -> source_pb2.Skill:
    return source_pb2.Skill(
        skill_id=s.skill_id,
        scope=_scope_out(s.scope),
        scope_id=s.scope_id,
        name=s.name,
        description=s.description,
        load_hint=s.load_hint,
        enabled=s.enabled,
        update_time=timestamp(s.update_time_ns),
        source=s.origin,
    )


class SourceServicer(pb_grpc.SourceServiceServicer):
    def __init__(self, sources: SourceUseCases, max_message_bytes: int = 64 << 20) -> None:
        self._s = sources
        self._max_message = max_message_bytes

    async def _listed(self, kind: SourceKind, scope: int, scope_id: str) -> list[Any]:
        return await self._s.list_entries(kind, scope_in(scope, required=False), scope_id)

    @unary
    async def PutMemory(self, request: pb.PutMemoryRequest, context: Ctx) -> pb.PutMemoryResponse:
        m = request.memory
        scope = scope_in(m.scope, required=True)
        assert scope is not None
        stored = await self._s.put(MemoryEntry(m.memory_id, scope, m.scope_id, m.text))
        assert isinstance(stored, MemoryEntry)
        return pb.PutMemoryResponse(memory=memory_out(stored))

    @unary
    async def ListMemory(
        self, request: pb.ListMemoryRequest, context: Ctx
    ) -> pb.ListMemoryResponse:
        found = await self._listed(SourceKind.MEMORY, request.scope, request.scope_id)
        listed = pb.ListMemoryResponse(memories=[memory_out(m) for m in found])
        check_fits(listed, self._max_message, "the memory listing")
        return listed

    @unary
    async def DeleteMemory(
        self, request: pb.DeleteMemoryRequest, context: Ctx
    ) -> pb.DeleteMemoryResponse:
        scope = scope_in(request.scope, required=True)
        await self._s.delete(SourceKind.MEMORY, scope, request.scope_id, request.memory_id)
        return pb.DeleteMemoryResponse()

    @unary
    async def PutRule(self, request: pb.PutRuleRequest, context: Ctx) -> pb.PutRuleResponse:
        r = request.rule
        scope = scope_in(r.scope, required=True)
        assert scope is not None
        if r.activation not in {int(a) for a in RuleActivation}:
            raise invalid("rule.activation", "activation must be ALWAYS, ON_DEMAND or MATCHED")
        if len(r.path_globs) > MAX_GLOBS:  # before copying what may be 100,000s of strings
            raise invalid("rule.path_globs", f"at most {MAX_GLOBS} globs per rule")
        entry = RuleEntry(
            r.rule_id,
            scope,
            r.scope_id,
            r.name,
            r.description,
            r.text,
            RuleActivation(r.activation),
            tuple(r.path_globs),
        )
        stored = await self._s.put(entry)
        assert isinstance(stored, RuleEntry)
        return pb.PutRuleResponse(rule=rule_out(stored))

    @unary
    async def ListRules(self, request: pb.ListRulesRequest, context: Ctx) -> pb.ListRulesResponse:
        found = await self._listed(SourceKind.RULE, request.scope, request.scope_id)
        listed = pb.ListRulesResponse(rules=[rule_out(r) for r in found])
        check_fits(listed, self._max_message, "the rule listing")
        return listed

    @unary
    async def DeleteRule(
        self, request: pb.DeleteRuleRequest, context: Ctx
    ) -> pb.DeleteRuleResponse:
        scope = scope_in(request.scope, required=True)
        await self._s.delete(SourceKind.RULE, scope, request.scope_id, request.rule_id)
        return pb.DeleteRuleResponse()

    @unary
    async def PutSkill(self, request: pb.PutSkillRequest, context: Ctx) -> pb.PutSkillResponse:
        s = request.skill
        scope = scope_in(s.scope, required=True)
        assert scope is not None
        entry = SkillEntry(
            s.skill_id, scope, s.scope_id, s.name, s.description, s.load_hint, s.enabled
        )
        stored = await self._s.put(entry)
        assert isinstance(stored, SkillEntry)
        return pb.PutSkillResponse(skill=skill_out(stored))

    @unary
    async def ListSkills(
        self, request: pb.ListSkillsRequest, context: Ctx
    ) -> pb.ListSkillsResponse:
        found = await self._listed(SourceKind.SKILL, request.scope, request.scope_id)
        listed = pb.ListSkillsResponse(skills=[skill_out(s) for s in found])
        check_fits(listed, self._max_message, "the skill listing")
        return listed

    @unary
    async def DeleteSkill(
        self, request: pb.DeleteSkillRequest, context: Ctx
    ) -> pb.DeleteSkillResponse:
        scope = scope_in(request.scope, required=True)
        await self._s.delete(SourceKind.SKILL, scope, request.scope_id, request.skill_id)
        return pb.DeleteSkillResponse()

    @unary
    async def LoadRule(self, request: pb.LoadRuleRequest, context: Ctx) -> pb.LoadRuleResponse:
        rule = await self._s.load_rule(request.session_id, request.name)
        return pb.LoadRuleResponse(rule=rule_out(rule))
