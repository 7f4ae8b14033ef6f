// The lab's Node client: the global fetch (undici), which ignores
// HTTP_PROXY and sets Host from the URL. Prints one JSON line.
//
//     node fetch.mjs URL COUNT
//
// {"responses": [{"status", "body"}, ...]}, or {"error", "cause"}.
const [url, count] = process.argv.slice(2);
const responses = [];
try {
  for (let i = 0; i < Number(count); i++) {
    const r = await fetch(url, { signal: AbortSignal.timeout(10000) });
    const text = await r.text();
    let body = text;
    try {
      body = JSON.parse(text);
    } catch {}
    responses.push({ status: r.status, body });
  }
  console.log(JSON.stringify({ responses }));
} catch (e) {
  console.log(JSON.stringify({ error: String(e), cause: String(e.cause ?? "") }));
}
