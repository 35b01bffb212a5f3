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
import { Session } from "./gen/ctxcc/v1/session.js";
import { CtxccError } from "./errors.js";
import { refuseLoneSurrogates } from "./text.js";
import { newRequestId, newSessionId, retry, SESSION_ALREADY_EXISTS, unaryOnce, type UnaryMethod } from "./retry.js";

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

  protected call<Req, Res>(method: unknown, req: Req, idempotent: boolean, attempted?: () => void): Promise<Res> {
    try {
      refuseLoneSurrogates(req);
    } catch (err) {
      return Promise.reject(err);
    }
    const fn = (method as UnaryMethod<Req, Res>).bind(this.raw);
    return retry(
      () => {
        attempted?.();
        return unaryOnce(fn, req, this.settings.metadata);
      },
      idempotent,
      this.settings.retrySeconds,
    );
  }
}

/** Whether `stored` is what creating `asked` stores: the same creation fields. */
function sameCreation(stored: Session, asked: Session): boolean {
  const a = Object.entries(stored.labels);
  const b = asked.labels;
  return (
    stored.workspaceId === asked.workspaceId &&
    stored.projectId === asked.projectId &&
    stored.projectRoot === asked.projectRoot &&
    stored.workingDirectory === asked.workingDirectory &&
    a.length === Object.keys(b).length &&
    a.every(([k, v]) => Object.hasOwn(b, k) && b[k] === v)
  );
}

/** Every unary RPC of SessionService with typed requests; missing fields get their defaults. */
export class Sessions extends Service<SessionServiceClient> {
  /**
   * Creates a session. An existing id answers ALREADY_EXISTS (reason SESSION_ALREADY_EXISTS).
   * Retried like any safe call: a session without an id gets one here ("s-" and 24 hex
   * digits) before the first attempt, so every attempt names the same session. A retry
   * answered SESSION_ALREADY_EXISTS may have met an earlier attempt's session, stored before
   * its answer was lost: it is read back and returned when its creation fields (workspace,
   * project, labels, project root, working directory) are the request's. The first attempt
   * refused so is a real conflict and throws as it is.
   */
  async createSession(req: DeepPartial<CreateSessionRequest> = {}): Promise<CreateSessionResponse> {
    const full = CreateSessionRequest.fromPartial(req);
    const session = (full.session ??= Session.fromPartial({}));
    session.sessionId ||= newSessionId(); // fixed before the first attempt, reused by every retry
    let attempts = 0;
    try {
      return await this.call<CreateSessionRequest, CreateSessionResponse>(this.raw.createSession, full, true, () => attempts++);
    } catch (err) {
      if (!(err instanceof CtxccError) || attempts < 2 || err.reason !== SESSION_ALREADY_EXISTS) throw err;
      let stored: Session | undefined;
      try {
        stored = (await this.getSession({ sessionId: session.sessionId })).session;
      } catch {
        throw err;
      }
      if (!stored || !sameCreation(stored, session)) throw err;
      return { session: stored };
    }
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
