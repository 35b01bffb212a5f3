/**
 * Creates one session and prints it, or the error it got: how a createSession waits out a
 * daemon that is restarting (see "Retries" in the README).
 *   CTXCC_TARGET=unix:///run/ctxcc/ctxcc.sock node dist/examples/create-session.js \
 *     --session '{"project_id": "p1", "labels": {"team": "infra"}}' --retry-seconds 30
 * Prints `created {json}` (the session's id and creation fields) or `error CODE REASON` and
 * exits 1.
 */
import { connect, CtxccError, grpc, RETRY_SECONDS, Session } from "../src/index.js";

function flag(name: string, fallback: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1] : fallback;
}

async function main(): Promise<number> {
  const asked = Session.fromJSON(JSON.parse(flag("session", "{}")));
  const retrySeconds = Number(flag("retry-seconds", String(RETRY_SECONDS)));
  const ctx = connect(process.env.CTXCC_TARGET ?? "127.0.0.1:50551", { retrySeconds });
  try {
    const s = await ctx.createSession(asked);
    const labels = Object.fromEntries(Object.entries(s.labels).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)));
    const out = {
      labels,
      project_id: s.projectId,
      project_root: s.projectRoot,
      session_id: s.sessionId,
      working_directory: s.workingDirectory,
      workspace_id: s.workspaceId,
    };
    console.log(`created ${JSON.stringify(out)}`);
    return 0;
  } catch (err) {
    if (!(err instanceof CtxccError)) throw err;
    console.log(`error ${grpc.status[err.code]} ${err.reason}`);
    return 1;
  } finally {
    ctx.close();
  }
}

main().then(
  (code) => process.exit(code),
  (err) => {
    console.error(err);
    process.exit(2);
  },
);
