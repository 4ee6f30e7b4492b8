// @ag-ui/client 1.0's HttpAgent, default settings (it POSTs a RunAgentInput),
// following one turn of `processor serve` (POST /v1/turns/{id}/events?format=agui).
//
//   node agui_client.mjs '{"url": ..., "token": ..., "cutAfter": null}'
//
// With "cutAfter": n, the run is aborted after its n-th event and run again on
// the same agent with `Last-Event-ID` set to the seq of the last event the
// agent applied (each event that carries an SSE id carries it as rawEvent.seq
// too), as docs/serve.md shows. Prints one JSON line: the agent's messages at
// the end, the event types of each run, and errors.
import { HttpAgent } from "@ag-ui/client";

const spec = JSON.parse(process.argv[2]);
const agent = new HttpAgent({
  url: spec.url,
  headers: { Authorization: `Bearer ${spec.token}` },
});
let lastSeq = null;
let seen = 0;
const runs = [];
const errors = [];
const outcomes = [];

async function run(cutAfter) {
  const types = [];
  runs.push(types);
  try {
    await agent.runAgent({}, {
      onEvent({ event }) {
        types.push(event.type);
        if (event.rawEvent && typeof event.rawEvent.seq === "number") lastSeq = event.rawEvent.seq;
        seen += 1;
        if (cutAfter !== null && seen === cutAfter) agent.abortRun();
      },
      onRunFinishedEvent({ outcome }) { outcomes.push(outcome); },
      onRunErrorEvent({ event }) { outcomes.push({ error: event.code ?? null, message: event.message }); },
    });
  } catch (error) {
    errors.push(String(error));
  }
}

await run(spec.cutAfter ?? null);
if (spec.cutAfter) {
  if (spec.resumeDelayMs) await new Promise((resolve) => setTimeout(resolve, spec.resumeDelayMs));
  if (lastSeq !== null) agent.headers = { ...agent.headers, "Last-Event-ID": String(lastSeq) };
  await run(null);
}
console.log(JSON.stringify({ messages: agent.messages, runs, errors, outcomes, lastSeq }));
