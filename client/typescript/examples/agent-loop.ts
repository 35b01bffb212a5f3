/**
 * An agent loop against a running ctxcc: append -> compile over the stream -> call a fake
 * provider -> queue its usage for the next step -> append the reply: one round trip per step.
 *   CTXCC_TARGET=unix:///run/ctxcc/ctxcc.sock node dist/examples/agent-loop.js --steps 20
 */
import { existsSync } from "node:fs";
import { assistant, connect, CtxccError, user, type Event } from "../src/index.js";

function flag(name: string, fallback: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1] : fallback;
}

async function main(): Promise<void> {
  const steps = Number(flag("steps", "20"));
  const bigStep = Number(flag("big-step", "-1"));
  const pauseAt = Number(flag("pause-at", "-1"));
  const resumeFile = flag("resume-file", "");
  const ctx = connect(process.env.CTXCC_TARGET ?? "127.0.0.1:50551");
  const route = { connection: "example", protocol: "fake", endpoint: "local", model: "gpt-4o" };
  const session = await ctx.createSession();
  console.log(`session ${session.sessionId}`);
  const stream = ctx.openStream();
  let pending: Event[] = [user("start the task")];
  let last = 0;
  let largest = 0;
  let carried = 0; // steps whose answer says the usage they carried was recorded
  for (let step = 0; step < steps; step++) {
    if (step === bigStep) {
      for (let i = 0; i < 6; i++) pending.push(user(`chunk ${i} line. `.repeat(60000)));
    }
    const started = performance.now();
    const { view, append, usage } = await stream.step({ sessionId: session.sessionId, route }, pending);
    if (usage && !usage.replayed) carried++;
    const ms = (performance.now() - started).toFixed(2);
    console.log(`step ${step} append ${append?.firstSeq ?? 0}-${append?.lastSeq ?? 0} replayed ${append?.replayed ?? false} ms ${ms} estimate ${view.budget!.estimatedInputTokens}`);
    const size = view.messages.reduce(
      (n, m) => n + m.parts.reduce((k, p) => k + (p.part?.$case === "text" ? p.part.value.length : 0), 0), 0);
    largest = Math.max(largest, size);
    // A fake provider's count of the request it was sent (about 4 characters a token, a few
    // per message), as a real provider counts: never ctxcc's estimate with a margin, which
    // compounds step after step (the estimate after a report is that report plus what is
    // new). Rides on the next step (the last one goes by ReportUsage at close).
    const inputTokens = Math.floor((size + view.systemPrompt.length) / 4) + 4 * view.messages.length + 7;
    await stream.reportUsage({ compileId: view.compileId, route, inputTokens, outputTokens: 40 + step });
    pending = [assistant(`reply ${step}`), user(`next step ${step + 1}`)];
    last = view.eventBoundary;
    if (step === pauseAt) {
      console.log("paused");
      while (!existsSync(resumeFile)) await new Promise((r) => setTimeout(r, 50));
    }
  }
  let reason = "";
  try {
    await ctx.getSession("no-such-session");
  } catch (err) {
    reason = (err as CtxccError).reason;
  }
  await stream.close();
  const { whole, deltas, mismatches } = stream.stats;
  console.log(
    `ok ${steps} steps session ${session.sessionId} seq ${last} largest_view_bytes ${largest} missing_reason ${reason}` +
      ` usage_carried ${carried} whole ${whole} deltas ${deltas} mismatches ${mismatches}`,
  );
  ctx.close();
}

main().catch((err) => {
  console.error("agent-loop:", err);
  process.exit(1);
});
