/**
 * Typed wrappers of every unary RPC: requests are DeepPartial (fields left out get their
 * proto defaults through fromPartial, never a serialization failure), calls that are safe to
 * repeat retry on UNAVAILABLE, and every error is a CtxccError. The generated grpc-js client
 * stays reachable as `raw` (streams: see Client and Stream).
 */
import * as grpc from "@grpc/grpc-js";

import type { DeepPartial } from "./gen/ctxcc/v1/common.js";
import { AppendEventsRequest, AppendEventsResponse, CreateSessionRequest, CreateSessionResponse, DeleteSessionRequest, DeleteSessionResponse, GetSessionRequest, GetSessionResponse, ListEventsRequest, ListEventsResponse, ListSessionsRequest, ListSessionsResponse, SessionServiceClient } from "./gen/ctxcc/v1/session_service.js";
import { CompileRequest, CompileResponse, CompileServiceClient, CreateCheckpointRequest, CreateCheckpointResponse, ListCheckpointsRequest, ListCheckpointsResponse, ReportUsageRequest, ReportUsageResponse } from "./gen/ctxcc/v1/compile_service.js";
import { ListToolsRequest, ListToolsResponse, ReadToolResultRequest, ReadToolResultResponse, RegisterToolsRequest, RegisterToolsResponse, SearchToolsRequest, SearchToolsResponse, ToolServiceClient } from "./gen/ctxcc/v1/tool_service.js";
import { DeleteMemoryRequest, DeleteMemoryResponse, DeleteRuleRequest, DeleteRuleResponse, DeleteSkillRequest, DeleteSkillResponse, ListMemoryRequest, ListMemoryResponse, ListRulesRequest, ListRulesResponse, ListSkillsRequest, ListSkillsResponse, LoadRuleRequest, LoadRuleResponse, PutMemoryRequest, PutMemoryResponse, PutRuleRequest, PutRuleResponse, PutSkillRequest, PutSkillResponse, SourceServiceClient } from "./gen/ctxcc/v1/source_service.js";
import { ArtifactServiceClient } from "./gen/ctxcc/v1/artifact_service.js";
import { newRequestId, retry, unaryOnce, type UnaryMethod } from "./retry.js";

/** What every call of one Client shares. */
export interface CallSettings {
  retrySeconds: number;
  metadata?: grpc.Metadata;
}

abstract class Service<C extends grpc.Client> {
  constructor(
    readonly raw: C,
    protected readonly settings: CallSettings,
  ) {}

  protected call<Req, Res>(method: unknown, req: Req, idempotent: boolean): Promise<Res> {
    const fn = (method as UnaryMethod<Req, Res>).bind(this.raw);
    return retry((left) => unaryOnce(fn, req, left, this.settings.metadata), idempotent, this.settings.retrySeconds);
  }
}

/** Every unary RPC of SessionService with typed requests; missing fields get their defaults. */
export class Sessions extends Service<SessionServiceClient> {
  /** Creates a session. An existing id answers ALREADY_EXISTS. */
  createSession(req: DeepPartial<CreateSessionRequest> = {}): Promise<CreateSessionResponse> {
    return this.call<CreateSessionRequest, CreateSessionResponse>(this.raw.createSession, CreateSessionRequest.fromPartial(req), false);
  }
  /** Returns one session. */
  getSession(req: DeepPartial<GetSessionRequest> = {}): Promise<GetSessionResponse> {
    return this.call<GetSessionRequest, GetSessionResponse>(this.raw.getSession, GetSessionRequest.fromPartial(req), true);
  }
  /** Lists sessions in id order, paged. */
  listSessions(req: DeepPartial<ListSessionsRequest> = {}): Promise<ListSessionsResponse> {
    return this.call<ListSessionsRequest, ListSessionsResponse>(this.raw.listSessions, ListSessionsRequest.fromPartial(req), true);
  }
  /**
   * Deletes a whole session: events, checkpoints, records and the blobs and
   * artifacts only it referenced. Events are never deleted one by one.
   */
  deleteSession(req: DeepPartial<DeleteSessionRequest> = {}): Promise<DeleteSessionResponse> {
    return this.call<DeleteSessionRequest, DeleteSessionResponse>(this.raw.deleteSession, DeleteSessionRequest.fromPartial(req), false);
  }
  /**
   * Appends events atomically: all or none. Idempotent by request_id;
   * optimistic by expected_last_seq.
   */
  appendEvents(req: DeepPartial<AppendEventsRequest> = {}): Promise<AppendEventsResponse> {
    const full = AppendEventsRequest.fromPartial(req);
    full.requestId ||= newRequestId(); // fixed before the first attempt, reused by every retry
    return this.call<AppendEventsRequest, AppendEventsResponse>(this.raw.appendEvents, full, true);
  }
  /** Lists events in seq order, paged, optionally filtered by kind. */
  listEvents(req: DeepPartial<ListEventsRequest> = {}): Promise<ListEventsResponse> {
    return this.call<ListEventsRequest, ListEventsResponse>(this.raw.listEvents, ListEventsRequest.fromPartial(req), true);
  }
}

/** Every unary RPC of CompileService with typed requests; missing fields get their defaults. */
export class Compiles extends Service<CompileServiceClient> {
  /** Compiles the view of the next step. */
  compile(req: DeepPartial<CompileRequest> = {}): Promise<CompileResponse> {
    return this.call<CompileRequest, CompileResponse>(this.raw.compile, CompileRequest.fromPartial(req), true);
  }
  /** Reports the provider's real usage for a compile (SPEC R-EST-5). Idempotent. */
  reportUsage(req: DeepPartial<ReportUsageRequest> = {}): Promise<ReportUsageResponse> {
    return this.call<ReportUsageRequest, ReportUsageResponse>(this.raw.reportUsage, ReportUsageRequest.fromPartial(req), true);
  }
  /** Stores a checkpoint after verifying its digest against the log. */
  createCheckpoint(req: DeepPartial<CreateCheckpointRequest> = {}): Promise<CreateCheckpointResponse> {
    const full = CreateCheckpointRequest.fromPartial(req);
    full.requestId ||= newRequestId(); // fixed before the first attempt, reused by every retry
    return this.call<CreateCheckpointRequest, CreateCheckpointResponse>(this.raw.createCheckpoint, full, true);
  }
  /** Lists a session's checkpoints, newest first. */
  listCheckpoints(req: DeepPartial<ListCheckpointsRequest> = {}): Promise<ListCheckpointsResponse> {
    return this.call<ListCheckpointsRequest, ListCheckpointsResponse>(this.raw.listCheckpoints, ListCheckpointsRequest.fromPartial(req), true);
  }
}

/** Every unary RPC of ToolService with typed requests; missing fields get their defaults. */
export class Tools extends Service<ToolServiceClient> {
  /** Registers or replaces tool definitions of a session. */
  registerTools(req: DeepPartial<RegisterToolsRequest> = {}): Promise<RegisterToolsResponse> {
    return this.call<RegisterToolsRequest, RegisterToolsResponse>(this.raw.registerTools, RegisterToolsRequest.fromPartial(req), true);
  }
  /** Lists a session's registry. */
  listTools(req: DeepPartial<ListToolsRequest> = {}): Promise<ListToolsResponse> {
    return this.call<ListToolsRequest, ListToolsResponse>(this.raw.listTools, ListToolsRequest.fromPartial(req), true);
  }
  /** Searches deferred tools; matches are activated for the current turn only. */
  searchTools(req: DeepPartial<SearchToolsRequest> = {}): Promise<SearchToolsResponse> {
    return this.call<SearchToolsRequest, SearchToolsResponse>(this.raw.searchTools, SearchToolsRequest.fromPartial(req), true);
  }
  /** Reads a stored tool result by lines or bytes, or searches it. */
  readToolResult(req: DeepPartial<ReadToolResultRequest> = {}): Promise<ReadToolResultResponse> {
    return this.call<ReadToolResultRequest, ReadToolResultResponse>(this.raw.readToolResult, ReadToolResultRequest.fromPartial(req), true);
  }
}

/** Every unary RPC of SourceService with typed requests; missing fields get their defaults. */
export class Sources extends Service<SourceServiceClient> {
  /** Creates or replaces a memory entry. */
  putMemory(req: DeepPartial<PutMemoryRequest> = {}): Promise<PutMemoryResponse> {
    return this.call<PutMemoryRequest, PutMemoryResponse>(this.raw.putMemory, PutMemoryRequest.fromPartial(req), true);
  }
  /** Lists memory entries of a scope. */
  listMemory(req: DeepPartial<ListMemoryRequest> = {}): Promise<ListMemoryResponse> {
    return this.call<ListMemoryRequest, ListMemoryResponse>(this.raw.listMemory, ListMemoryRequest.fromPartial(req), true);
  }
  /** Deletes a memory entry. */
  deleteMemory(req: DeepPartial<DeleteMemoryRequest> = {}): Promise<DeleteMemoryResponse> {
    return this.call<DeleteMemoryRequest, DeleteMemoryResponse>(this.raw.deleteMemory, DeleteMemoryRequest.fromPartial(req), false);
  }
  /** Creates or replaces a rule. */
  putRule(req: DeepPartial<PutRuleRequest> = {}): Promise<PutRuleResponse> {
    return this.call<PutRuleRequest, PutRuleResponse>(this.raw.putRule, PutRuleRequest.fromPartial(req), true);
  }
  /** Lists rules of a scope. */
  listRules(req: DeepPartial<ListRulesRequest> = {}): Promise<ListRulesResponse> {
    return this.call<ListRulesRequest, ListRulesResponse>(this.raw.listRules, ListRulesRequest.fromPartial(req), true);
  }
  /** Deletes a rule. */
  deleteRule(req: DeepPartial<DeleteRuleRequest> = {}): Promise<DeleteRuleResponse> {
    return this.call<DeleteRuleRequest, DeleteRuleResponse>(this.raw.deleteRule, DeleteRuleRequest.fromPartial(req), false);
  }
  /** Creates or replaces a skill. */
  putSkill(req: DeepPartial<PutSkillRequest> = {}): Promise<PutSkillResponse> {
    return this.call<PutSkillRequest, PutSkillResponse>(this.raw.putSkill, PutSkillRequest.fromPartial(req), true);
  }
  /** Lists skills of a scope. */
  listSkills(req: DeepPartial<ListSkillsRequest> = {}): Promise<ListSkillsResponse> {
    return this.call<ListSkillsRequest, ListSkillsResponse>(this.raw.listSkills, ListSkillsRequest.fromPartial(req), true);
  }
  /** Deletes a skill. */
  deleteSkill(req: DeepPartial<DeleteSkillRequest> = {}): Promise<DeleteSkillResponse> {
    return this.call<DeleteSkillRequest, DeleteSkillResponse>(this.raw.deleteSkill, DeleteSkillRequest.fromPartial(req), false);
  }
  /**
   * Returns the full text of a rule a session can see (registered or from a rule
   * file), by name. Agents serve the built-in `load_rule` tool with it.
   */
  loadRule(req: DeepPartial<LoadRuleRequest> = {}): Promise<LoadRuleResponse> {
    return this.call<LoadRuleRequest, LoadRuleResponse>(this.raw.loadRule, LoadRuleRequest.fromPartial(req), true);
  }
}

/** Every unary RPC of ArtifactService with typed requests; missing fields get their defaults. */
export class Artifacts extends Service<ArtifactServiceClient> {
}
