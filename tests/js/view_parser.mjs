// The watch page's SSE parser (processor/serve/static/view.html, between
// its sse-parser markers) fed the cases of a JSON file: each case is a list
// of text chunks; prints, per case, what it dispatched ([data, last id])
// and the retry values it read, as one JSON line.
import { readFileSync } from "node:fs";

const [page, casesFile] = process.argv.slice(2);
const html = readFileSync(page, "utf8");
const start = html.indexOf("// sse-parser:start");
const end = html.indexOf("// sse-parser:end");
if (start < 0 || end < start) throw new Error("no sse-parser markers in " + page);
const Parser = new Function(html.slice(start, end) + "\nreturn Parser;")();

const out = [];
for (const chunks of JSON.parse(readFileSync(casesFile, "utf8"))) {
  const events = [];
  const retries = [];
  const parser = new Parser((data, id) => events.push([data, id]), ms => retries.push(ms), null);
  for (const chunk of chunks) parser.feed(chunk);
  out.push({ events, retries });
}
// ASCII only: the reader splits lines at any Unicode line break.
console.log(JSON.stringify(out).replace(/[\u007f-\uffff]/g,
  c => "\\u" + c.charCodeAt(0).toString(16).padStart(4, "0")));
