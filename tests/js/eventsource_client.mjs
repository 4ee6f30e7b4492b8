// Follow one turn with the `eventsource` package (the WHATWG EventSource for
// Node.js) until its terminal event (type "synthesis"), reconnecting as it
// does by itself. Prints one JSON document:
// {events: [{id: lastEventId, data}], requests: [Last-Event-ID sent or null], timedOut}.
//
// usage: node eventsource_client.mjs <events url with ?token=> [timeout ms]
import { EventSource } from 'eventsource';

const [url, timeoutMs = '60000'] = process.argv.slice(2);
const events = [];
const requests = [];
// eventsource unrefs its reconnect timer: keep the process alive until done.
const alive = setInterval(() => {}, 1000);

const done = new Promise((resolve) => {
  const source = new EventSource(url, {
    fetch: (input, init) => {
      requests.push(init.headers['Last-Event-ID'] ?? null);
      return fetch(input, init);
    },
  });
  const timer = setTimeout(() => { source.close(); resolve(true); }, Number(timeoutMs));
  source.onmessage = (event) => {
    events.push({ id: event.lastEventId || null, data: event.data });
    if (JSON.parse(event.data).type === 'synthesis') {
      clearTimeout(timer);
      source.close();
      resolve(false);
    }
  };
});
const timedOut = await done;
clearInterval(alive);
console.log(JSON.stringify({ events, requests, timedOut }));
