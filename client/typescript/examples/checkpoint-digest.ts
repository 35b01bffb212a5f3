/**
 * Prints the covered_digest of events 1..N of a session, computed on the client from
 * ListEvents, as a checkpoint created in COVERED_DIGEST_MODE_VERIFY must carry it.
 *
 *   CTXCC_TARGET=unix:///run/ctxcc/ctxcc.sock node dist/examples/checkpoint-digest.js s1 12
 */
import * as grpc from "@grpc/grpc-js";

import { coveredDigest } from "../src/digest.js";
import { Event } from "../src/gen/ctxcc/v1/event.js";
import { ListEventsResponse, SessionServiceClient } from "../src/gen/ctxcc/v1/session_service.js";

async function main(): Promise<void> {
  const [sessionId, throughText] = process.argv.slice(2);
  const through = Number(throughText);
  const target = process.env.CTXCC_TARGET ?? "127.0.0.1:50551";
  const client = new SessionServiceClient(target, grpc.credentials.createInsecure(), {
    "grpc.max_receive_message_length": 64 << 20,
  });
  const events: Event[] = [];
  let pageToken = "";
  do {
    const page = await new Promise<ListEventsResponse>((resolve, reject) =>
      client.listEvents(
        { sessionId, pageSize: 1000, pageToken, afterSeq: 0, kinds: [] },
        (err, res) => (err ? reject(err) : resolve(res)),
      ),
    );
    events.push(...page.events.filter((e) => e.seq <= through));
    pageToken = page.nextPageToken;
  } while (pageToken);
  client.close();
  console.log(coveredDigest(events));
}

main().catch((err: unknown) => {
  console.error("checkpoint-digest:", err);
  process.exit(1);
});
