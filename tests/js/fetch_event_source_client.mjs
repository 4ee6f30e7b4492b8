// Follow one turn with @microsoft/fetch-event-source and its DEFAULT handlers
// (no onopen, onerror or onclose): the promise resolves when a stream ends
// cleanly, and a broken one is retried after the server's `retry:` with the
// last id as Last-Event-ID. Prints one JSON document:
// {events: [{id, data}], requests: [last-event-id sent or null], timedOut}.
//
// usage: node fetch_event_source_client.mjs <events url> <token> [timeout ms]
import { fetchEventSource } from '@microsoft/fetch-event-source';

// The library is written for browsers: `window` for fetch and timers,
// `document` for its visibility handling (off with openWhenHidden, but it
// still removes its listener when done).
globalThis.window = globalThis;
globalThis.document = { hidden: false, addEventListener() {}, removeEventListener() {} };

const [url, token, timeoutMs = '60000'] = process.argv.slice(2);
const events = [];
const requests = [];
const controller = new AbortController();
let timedOut = false;
const timer = setTimeout(() => { timedOut = true; controller.abort(); }, Number(timeoutMs));

await fetchEventSource(url, {
  headers: { Authorization: `Bearer ${token}` },
  openWhenHidden: true,
  signal: controller.signal,
  fetch: (input, init) => {
    requests.push(init.headers['last-event-id'] ?? null);
    return fetch(input, init);
  },
  onmessage: (message) => {
    events.push({ id: message.id || null, data: message.data });
  },
});
clearTimeout(timer);
console.log(JSON.stringify({ events, requests, timedOut }));
