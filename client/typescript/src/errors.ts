/** Errors keyed by the daemon's google.rpc.ErrorInfo reason, never by message text. */
import { BinaryReader } from "@bufbuild/protobuf/wire";
import * as grpc from "@grpc/grpc-js";

/** A failed call with the daemon's stable ErrorInfo reason. */
export class CtxccError extends Error {
  constructor(
    readonly code: number,
    readonly reason: string,
    message: string,
    readonly metadata: Record<string, string> = {},
    /** A stream step failed because the usage report it carried was refused: nothing of the
     * step was done (no append, no compile). */
    readonly usageRefused = false,
  ) {
    const name = grpc.status[code] ?? String(code);
    // Without an ErrorInfo the reason is the code's name: said once, not twice.
    super(`${reason === name ? name : `${name} ${reason}`}: ${message}`);
  }
}

function decodeErrorInfo(bytes: Uint8Array): { reason: string; metadata: Record<string, string> } {
  // google.rpc.Status{details: [Any{type_url, value: ErrorInfo{reason, domain, metadata}}]}
  const out = { reason: "", metadata: {} as Record<string, string> };
  const status = new BinaryReader(bytes);
  while (status.pos < status.len) {
    const [field, wire] = status.tag();
    if (field !== 3) {
      status.skip(wire);
      continue;
    }
    const any = new BinaryReader(status.bytes());
    let typeUrl = "";
    let value: Uint8Array = new Uint8Array();
    while (any.pos < any.len) {
      const [f, w] = any.tag();
      if (f === 1) typeUrl = any.string();
      else if (f === 2) value = any.bytes();
      else any.skip(w);
    }
    if (!typeUrl.endsWith("google.rpc.ErrorInfo")) continue;
    const info = new BinaryReader(value);
    while (info.pos < info.len) {
      const [f, w] = info.tag();
      if (f === 1) out.reason = info.string();
      else if (f === 3) {
        const entry = new BinaryReader(info.bytes());
        let key = "";
        let val = "";
        while (entry.pos < entry.len) {
          const [ef, ew] = entry.tag();
          if (ef === 1) key = entry.string();
          else if (ef === 2) val = entry.string();
          else entry.skip(ew);
        }
        out.metadata[key] = val;
      } else info.skip(w);
    }
  }
  return out;
}

/** Any error of a call (a grpc-js ServiceError, a step error) as a CtxccError. */
export function toCtxccError(err: unknown): CtxccError {
  if (err instanceof CtxccError) return err;
  const e = err as grpc.ServiceError;
  const details = e.metadata?.get("grpc-status-details-bin")?.[0];
  const info = details instanceof Buffer ? decodeErrorInfo(details) : { reason: "", metadata: {} };
  const code = typeof e.code === "number" ? e.code : grpc.status.UNKNOWN;
  return new CtxccError(code, info.reason || grpc.status[code], e.details ?? String(err), info.metadata);
}

