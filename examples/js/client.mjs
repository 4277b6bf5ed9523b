// A JavaScript client of itxd written from schema/itx.capnp alone, on npm capnp-es. It logs in,
// appends a batch through one pipelined chain, pages through the stream, matches an error by its
// code, and mounts a Receiver that an itx-call subscription delivers to. In this directory:
//
//   npm install && npm run generate        # gen/itx.js (+ .d.ts) from the schema; needs `capnp`
//   node client.mjs 127.0.0.1:7878 itx_...
//   node client.mjs 127.0.0.1:7878 itx_... itxd.crt   # over TLS, trusting that CA certificate
import { readFileSync } from "node:fs";
import { Conn } from "capnp-es";
import { Gateway, Receiver, StartPosition } from "./gen/itx.js";
import { TcpTransport } from "./tcp-transport.mjs";

// errorCode returns the itx code of an error: the first "itx.<code>: " in its message. capnp-es
// puts its own text in front ("CAPNP-TS116 RPC method failed at ...: "), so never match a prefix.
export function errorCode(err) {
  const m = /itx\.([A-Za-z]+): /.exec(String(err?.message ?? err));
  return m ? m[1] : "";
}

async function main([address, token, caFile]) {
  if (!address || !token) {
    console.error("usage: node client.mjs <host:port> <token> [ca.pem]");
    process.exit(2);
  }
  const transport = await TcpTransport.connect(address, caFile ? { ca: readFileSync(caFile) } : {});
  const conn = new Conn(transport);
  const gateway = conn.bootstrap(Gateway);

  // login -> streams() -> get(path): three pipelined calls, nothing awaited yet.
  const project = gateway.login((p) => { p.token = token; }).getProject();
  const stream = project.streams().getStreams().get((p) => { p.path = "/examples/js"; }).getStream();

  // The append travels with the chain: the first answer awaited is its result.
  const appended = await stream.append((p) => {
    const events = p._initEvents(3);
    for (let i = 0; i < 3; i++) {
      events.get(i).type = "example/note";
      events.get(i).payload = JSON.stringify({ n: i + 1 });
    }
  }).promise();
  // UInt64 fields read as BigInt: offsets beyond 2^53 stay exact.
  console.log(`appended ${appended.result.offsets.length} events, head ${appended.result.headOffset}`);

  // Paging: two events a page, continuing from nextAfter until a page comes back empty.
  let after = 0n, seen = 0, pages = 0;
  for (;;) {
    const { page } = await stream.getEventPage((p) => {
      const q = p._initQuery();
      q.after = after;
      q.limit = 2;
    }).promise();
    if (page.events.length === 0) break;
    seen += page.events.length;
    pages++;
    after = page.nextAfter;
  }
  console.log(`paged ${seen} events in ${pages} pages`);

  // An error, matched by its code.
  try {
    await stream.append((p) => { p._initEvents(1).get(0).type = ""; }).promise();
    console.log("error: none");
  } catch (err) {
    console.log(`error code ${errorCode(err)}`);
  }

  // A mounted Receiver, delivered to by an itx-call subscription. The handle keeps the mount.
  let delivered;
  const got = new Promise((resolve) => { delivered = resolve; });
  const inbox = new Receiver.Server({
    async receive(params) {
      const batch = params.batch;
      for (const e of batch.events) {
        if (e.type === "example/ping") delivered(`receiver got example/ping at offset ${e.offset} from ${batch.path}`);
      }
      // Returning acknowledges the whole batch (confirmedOffset 0).
    },
  });
  const { handle } = await project.capabilities().getCapabilities().mount((p) => {
    p.name = "example-inbox";
    p.receiver = inbox.client();
  }).promise();

  await stream.subscriptions().getSubscriptions().configure((p) => {
    const config = p._initConfig();
    config.name = "example-hook";
    config.receiver._initItxCall().capability = "example-inbox";
    config.start = StartPosition.NOW; // BEGINNING (the default) would deliver stream/* records too
  }).promise();

  await stream.append((p) => { p._initEvents(1).get(0).type = "example/ping"; }).promise();

  let timer;
  const timeout = new Promise((resolve) => { timer = setTimeout(() => resolve("receiver: timed out"), 20_000); });
  console.log(await Promise.race([got, timeout]));
  clearTimeout(timer);
  await handle.cancel().promise();
  conn.shutdown();
  transport.close();
}

main(process.argv.slice(2)).catch((err) => {
  console.error(err);
  process.exit(1);
});
