// The AI SDK's own resume path against processor serve, as useChat({ resume: true })
// takes it: DefaultChatTransport.reconnectToStream({ chatId }) (GET {api}/{chatId}/stream,
// the transport's headers sent as they are) and readUIMessageStream, which builds the
// UIMessage from the chunks. Prints one JSON line: the HTTP outcome (204: nothing to
// resume), the final UIMessage, every chunk the transport parsed, and any error.
//
// usage: node ai_sdk_client.mjs <api> <chatId> [<token>]
//   api: the transport's api, e.g. http://127.0.0.1:8080/v1/turns (a query, such as
//   ?token=... or ?wait=30, is kept: the transport puts /{chatId}/stream before it).
//   token: sent as Authorization: Bearer <token> through the transport's headers.
import { DefaultChatTransport, readUIMessageStream } from 'ai';

const [api, chatId, token] = process.argv.slice(2);
const transport = new DefaultChatTransport({
  api,
  headers: token ? { Authorization: `Bearer ${token}` } : {},
});

const out = { resumed: false, message: null, chunks: [], errors: [] };
try {
  const stream = await transport.reconnectToStream({ chatId });
  if (stream != null) {
    out.resumed = true;
    const [forMessage, forChunks] = stream.tee();
    const chunks = (async () => {
      for await (const chunk of forChunks) out.chunks.push(chunk);
    })();
    for await (const message of readUIMessageStream({
      stream: forMessage,
      onError: (error) => out.errors.push(String(error)),
    })) {
      out.message = message;
    }
    await chunks;
  }
} catch (error) {
  out.errors.push(`${error?.name}: ${error?.message} ${error?.statusCode ?? ''}`.trim());
}
console.log(JSON.stringify(out));
