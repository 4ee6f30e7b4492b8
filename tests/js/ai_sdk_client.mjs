// The AI SDK's own resume path against processor serve, as useChat({ resume: true })
// takes it: DefaultChatTransport.reconnectToStream({ chatId }) (GET {api}/{chatId}/stream,
// the transport's headers sent as they are) and readUIMessageStream, which builds the
// UIMessage from the chunks. Prints one JSON line: the HTTP outcome (204: nothing to
// resume), the final UIMessage, every chunk the transport parsed, and any error.
//
// With --chat <n>: instead, a Chat (AbstractChat, what useChat wraps, with a plain
// state in place of React's) calls resumeStream() n times in a row, as useChat({ resume:
// true }) does on mount and again when a page comes back; prints its status, error and
// messages.
//
// usage: node ai_sdk_client.mjs <api> <chatId> [<token>] [--chat <n>]
//   api: the transport's api, e.g. http://127.0.0.1:8080/v1/turns (a query, such as
//   ?token=... or ?wait=30, is kept: the transport puts /{chatId}/stream before it).
//   token: sent as Authorization: Bearer <token> through the transport's headers.
import { AbstractChat, DefaultChatTransport, readUIMessageStream } from 'ai';

const args = process.argv.slice(2);
const chatAt = args.indexOf('--chat');
const resumes = chatAt >= 0 ? Number(args.splice(chatAt, 2)[1]) : 0;
const [api, chatId, token] = args;
const transport = new DefaultChatTransport({
  api,
  headers: token ? { Authorization: `Bearer ${token}` } : {},
});

class PlainState {
  status = 'ready';
  error = undefined;
  messages = [];
  pushMessage(message) { this.messages = [...this.messages, message]; }
  popMessage() { this.messages = this.messages.slice(0, -1); }
  replaceMessage(index, message) {
    this.messages = this.messages.map((m, i) => (i === index ? message : m));
  }
  snapshot(thing) { return structuredClone(thing); }
}

class Chat extends AbstractChat {
  constructor(init) { super({ ...init, state: new PlainState() }); }
}

if (resumes > 0) {
  const chat = new Chat({ id: chatId, transport });
  for (let i = 0; i < resumes; i++) await chat.resumeStream();
  console.log(JSON.stringify({
    status: chat.status, error: chat.error ? String(chat.error) : null, messages: chat.messages,
  }));
  process.exit(0);
}

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
