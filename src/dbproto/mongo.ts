/**
 * MongoDB client messages, as the agent follows them to check the database name of every command and the user
 * of every authentication (MongoDB wire protocol: OP_MSG, and OP_QUERY for the legacy handshake). Pure, bounded
 * and incremental: MongoCommandScanner.push takes each chunk the client sends and answers events with offsets in
 * that chunk, like the Redis scanner:
 *
 *   { kind: 'start', at }                         a message begins at this byte;
 *   { kind: 'ready', at, requestId, op, command, db, user? }   from this byte on, its command is known (the whole
 *                                                 body, section 0, is in; what follows, such as the documents of a
 *                                                 kind-1 section, is counted through and never kept);
 *   { kind: 'invalid', at, reason }               not a message the agent can follow: it stops there.
 *
 * Read: the command (the body's first key), `$db` (OP_MSG; for OP_QUERY, the collection name's database), and
 * the user an authentication names: saslStart's SCRAM payload (`n,,n=<user>,...`) or PLAIN payload
 * (`authzid\0user\0password`), authenticate's `user`, and the same inside hello's speculativeAuthenticate. A
 * mechanism whose user cannot be read (GSSAPI, AWS, OIDC) is refused; so are OP_COMPRESSED (a client that asks
 * the server for compression), a body that is not section 0 first, the legacy opcodes, and OP_QUERY other than
 * the handshake (hello / isMaster). Bounds: a message of at most 48 MB (the server's maxMessageSizeBytes), a
 * body of at most MONGO_MAX_BODY_BYTES held until it is whole; every BSON length is checked against the bytes
 * that hold it.
 */

export const MONGO_MAX_MESSAGE_BYTES = 48_000_000;
/** The server's BSON limit (16 MiB) and the 16 KiB it allows commands above it. */
export const MONGO_MAX_BODY_BYTES = 16 * 1024 * 1024 + 16 * 1024;
export const OP_MSG = 2013;
export const OP_QUERY = 2004;
export const OP_REPLY = 1;
const HEADER = 16;

export type MongoEvent =
  | { kind: 'start'; at: number }
  | { kind: 'ready'; at: number; requestId: number; op: 'msg' | 'query'; command: string; db: string; user?: string }
  | { kind: 'invalid'; at: number; reason: string; requestId?: number; op?: 'msg' | 'query' };

/** Commands that authenticate or describe the server, run on whatever database the client names (admin, usually). */
export const MONGO_HANDSHAKE_COMMANDS: ReadonlySet<string> = new Set(['hello', 'ismaster', 'saslstart', 'saslcontinue', 'authenticate', 'logout', 'buildinfo', 'ping', 'getnonce', 'endsessions']);

interface Element {
  name: string;
  type: number;
  /** Where the value starts and ends in the document's buffer. */
  start: number;
  end: number;
}

/** The top-level elements of a BSON document, or a reason it is not one. */
export function bsonElements(doc: Buffer): Element[] | string {
  if (doc.length < 5 || doc.readInt32LE(0) !== doc.length || doc[doc.length - 1] !== 0) return 'a BSON document whose length does not fit';
  const out: Element[] = [];
  let at = 4;
  while (at < doc.length - 1) {
    const type = doc[at]!;
    const nameEnd = doc.indexOf(0, at + 1);
    if (nameEnd < 0 || nameEnd >= doc.length - 1) return 'a BSON element name without its end';
    const start = nameEnd + 1;
    const size = valueSize(doc, type, start);
    if (size === undefined || start + size > doc.length - 1) return `a BSON element of type ${type} that does not fit`;
    out.push({ name: doc.toString('utf8', at + 1, nameEnd), type, start, end: start + size });
    at = start + size;
  }
  return at === doc.length - 1 ? out : 'bytes after the last BSON element';
}

const FIXED: Record<number, number> = { 0x01: 8, 0x06: 0, 0x07: 12, 0x08: 1, 0x09: 8, 0x0a: 0, 0x10: 4, 0x11: 8, 0x12: 8, 0x13: 16, 0xff: 0, 0x7f: 0 };

function valueSize(doc: Buffer, type: number, at: number): number | undefined {
  const fixed = FIXED[type];
  if (fixed !== undefined) return fixed;
  const int32 = () => (at + 4 <= doc.length ? doc.readInt32LE(at) : -1);
  switch (type) {
    case 0x02: case 0x0d: case 0x0e: { // string, JavaScript code, symbol: int32 length (with the NUL), bytes
      const n = int32();
      return n >= 1 ? 4 + n : undefined;
    }
    case 0x03: case 0x04: case 0x0f: { // document, array, code with scope: int32 total length
      const n = int32();
      return n >= 5 ? n : undefined;
    }
    case 0x05: { // binary: int32 length, subtype, bytes
      const n = int32();
      return n >= 0 ? 5 + n : undefined;
    }
    case 0x0b: { // regular expression: two cstrings
      const a = doc.indexOf(0, at);
      const b = a < 0 ? -1 : doc.indexOf(0, a + 1);
      return b < 0 ? undefined : b + 1 - at;
    }
    case 0x0c: { // DBPointer: string, 12 bytes
      const n = int32();
      return n >= 1 ? 4 + n + 12 : undefined;
    }
    default:
      return undefined;
  }
}

function stringValue(doc: Buffer, e: Element): string | undefined {
  return e.type === 0x02 ? doc.toString('utf8', e.start + 4, e.end - 1) : undefined;
}

/** The user a SCRAM client-first message or a PLAIN message names, or undefined when neither can be read. */
export function saslUser(mechanism: string, payload: Buffer): string | undefined {
  const text = payload.toString('utf8');
  if (mechanism === 'PLAIN') {
    const parts = text.split('\0');
    return parts.length === 3 && parts[1] ? parts[1] : undefined;
  }
  if (mechanism !== 'SCRAM-SHA-1' && mechanism !== 'SCRAM-SHA-256') return undefined;
  // gs2-header "n,," (no channel binding, no authzid), then "n=<user>,r=<nonce>"; "=2C" and "=3D" escape , and =.
  const m = /^[ny],,n=([^,]*),r=/.exec(text);
  if (!m || !m[1]) return undefined;
  return m[1].replace(/=2C/g, ',').replace(/=3D/g, '=');
}

/** The one element of that name: a name given twice is read as absent (the server's reading of it is not ours to guess). */
function only(elements: Element[], name: string): Element | undefined {
  const found = elements.filter((e) => e.name === name);
  return found.length === 1 ? found[0] : undefined;
}

/** The user an authenticating command document (saslStart, authenticate) names; null for a command that names none. */
function authUser(doc: Buffer, elements: Element[], command: string): string | undefined | null {
  const field = (name: string) => only(elements, name);
  if (command === 'authenticate') {
    const user = field('user');
    return user ? stringValue(doc, user) : undefined;
  }
  if (command !== 'saslstart') return null;
  const mech = field('mechanism');
  const payload = field('payload');
  const mechanism = mech ? stringValue(doc, mech) : undefined;
  if (!mechanism || !payload || payload.type !== 0x05) return undefined;
  return saslUser(mechanism, doc.subarray(payload.start + 5, payload.end));
}

/** The command, $db and user of a body; a string when it cannot be read. */
export function readCommand(body: Buffer): { command: string; db?: string; user?: string } | string {
  const elements = bsonElements(body);
  if (typeof elements === 'string') return elements;
  const first = elements[0];
  if (!first) return 'an empty command';
  const command = first.name.toLowerCase();
  const twice = ['$db', 'speculativeAuthenticate'].find((n) => elements.filter((e) => e.name === n).length > 1);
  if (twice) return `${twice} given twice`;
  const dbElement = elements.find((e) => e.name === '$db');
  const db = dbElement ? stringValue(body, dbElement) : undefined;
  let user = authUser(body, elements, command);
  if (user === undefined) return `a ${first.name} whose user the agent cannot read (only SCRAM and PLAIN are)`;
  const speculative = elements.find((e) => e.name === 'speculativeAuthenticate');
  if (speculative) {
    if (speculative.type !== 0x03) return 'a speculativeAuthenticate that is not a document';
    const inner = body.subarray(speculative.start, speculative.end);
    const innerElements = bsonElements(inner);
    if (typeof innerElements === 'string' || !innerElements[0]) return 'a speculativeAuthenticate that cannot be read';
    const named = authUser(inner, innerElements, innerElements[0].name.toLowerCase());
    if (named === undefined || named === null) return 'a speculativeAuthenticate whose user the agent cannot read';
    user = named;
  }
  return { command, ...(db === undefined ? {} : { db }), ...(user === null ? {} : { user }) };
}

type Decision = { need: number } | { invalid: string } | { command: string; db: string; user?: string };

/** What the prefix of a message decides: more bytes needed (to `need` in all), a refusal, or its command. */
function decide(prefix: Buffer): Decision {
  if (prefix.length < HEADER) return { need: HEADER };
  const length = prefix.readInt32LE(0);
  const op = prefix.readInt32LE(12);
  if (length < HEADER + 5 || length > MONGO_MAX_MESSAGE_BYTES) return { invalid: `a message of ${length} bytes` };
  if (op === OP_MSG) {
    if (prefix.length < HEADER + 9) return { need: HEADER + 9 };
    if (prefix.readUInt32LE(HEADER) & ~0x10003) return { invalid: 'OP_MSG flags the agent does not know' };
    if (prefix[HEADER + 4] !== 0) return { invalid: 'an OP_MSG whose first section is not its body (kind 0)' };
    const bodyLength = prefix.readInt32LE(HEADER + 5);
    if (bodyLength < 5 || bodyLength > MONGO_MAX_BODY_BYTES || HEADER + 5 + bodyLength > length) return { invalid: `an OP_MSG body of ${bodyLength} bytes` };
    if (prefix.length < HEADER + 5 + bodyLength) return { need: HEADER + 5 + bodyLength };
    const read = readCommand(prefix.subarray(HEADER + 5, HEADER + 5 + bodyLength));
    if (typeof read === 'string') return { invalid: read };
    if (read.db === undefined) return { invalid: 'an OP_MSG without $db' };
    return { ...read, db: read.db };
  }
  if (op === OP_QUERY) return decideQuery(prefix, length);
  return { invalid: op === 2012 ? 'OP_COMPRESSED (turn compression off in the client: compressors=none)' : `opcode ${op} (only OP_MSG, and OP_QUERY for the handshake)` };
}

/** OP_QUERY: flags, the collection name ("admin.$cmd"), skip, return, then the query: only the handshake. */
function decideQuery(prefix: Buffer, length: number): Decision {
  const nameStart = HEADER + 4;
  const nameEnd = prefix.indexOf(0, nameStart);
  if (nameEnd < 0) return prefix.length - nameStart > 256 ? { invalid: 'an OP_QUERY collection name over 256 bytes' } : { need: Math.min(length, prefix.length + 1) };
  const docAt = nameEnd + 1 + 8;
  if (prefix.length < docAt + 4) return { need: docAt + 4 };
  const docLength = prefix.readInt32LE(docAt);
  if (docLength < 5 || docLength > MONGO_MAX_BODY_BYTES || docAt + docLength > length) return { invalid: `an OP_QUERY query of ${docLength} bytes` };
  if (prefix.length < docAt + docLength) return { need: docAt + docLength };
  const read = readCommand(prefix.subarray(docAt, docAt + docLength));
  if (typeof read === 'string') return { invalid: read };
  if (read.command !== 'hello' && read.command !== 'ismaster') return { invalid: `OP_QUERY ${read.command} (only the handshake is sent this way)` };
  const collection = prefix.toString('utf8', nameStart, nameEnd);
  return { command: read.command, db: collection.split('.')[0] ?? '' };
}

export class MongoCommandScanner {
  private prefix: Buffer = Buffer.alloc(0);
  private remaining = 0;
  private stopped = false;

  push(chunk: Buffer): MongoEvent[] {
    const events: MongoEvent[] = [];
    let at = 0;
    while (at < chunk.length && !this.stopped) {
      if (this.remaining > 0) {
        const take = Math.min(this.remaining, chunk.length - at);
        this.remaining -= take;
        at += take;
        continue;
      }
      if (this.prefix.length === 0) events.push({ kind: 'start', at });
      at = this.fill(chunk, at, events);
    }
    return events;
  }

  /** Adds bytes to the current message's prefix until it decides; returns where it stopped in chunk. */
  private fill(chunk: Buffer, at: number, events: MongoEvent[]): number {
    for (;;) {
      const d = decide(this.prefix);
      const requestId = this.prefix.length >= 8 ? this.prefix.readInt32LE(4) : 0;
      const op = this.prefix.length >= 16 ? (this.prefix.readInt32LE(12) === OP_QUERY ? 'query' : 'msg') : 'msg';
      if ('invalid' in d) {
        this.stopped = true;
        events.push({ kind: 'invalid', at, reason: d.invalid, ...(this.prefix.length >= 16 ? { requestId, op } : {}) });
        return chunk.length;
      }
      if ('command' in d) {
        this.remaining = this.prefix.readInt32LE(0) - this.prefix.length;
        this.prefix = Buffer.alloc(0);
        events.push({ kind: 'ready', at, requestId, op, command: d.command, db: d.db, ...(d.user === undefined ? {} : { user: d.user }) });
        return at;
      }
      if (at >= chunk.length) return at;
      const take = Math.min(d.need - this.prefix.length, chunk.length - at);
      this.prefix = Buffer.concat([this.prefix, chunk.subarray(at, at + take)]);
      at += take;
    }
  }
}

/** A BSON document of string, int32 and double fields (what an error reply needs). */
function bson(fields: Array<[string, string | number, 'string' | 'int32' | 'double']>): Buffer {
  const parts = fields.map(([name, value, type]) => {
    const key = Buffer.from(`${name}\0`);
    if (type === 'string') {
      const text = Buffer.from(`${String(value).replace(/\0/g, '')}\0`, 'utf8');
      const len = Buffer.alloc(4);
      len.writeInt32LE(text.length);
      return Buffer.concat([Buffer.from([0x02]), key, len, text]);
    }
    const v = Buffer.alloc(type === 'int32' ? 4 : 8);
    if (type === 'int32') v.writeInt32LE(Number(value));
    else v.writeDoubleLE(Number(value));
    return Buffer.concat([Buffer.from([type === 'int32' ? 0x10 : 0x01]), key, v]);
  });
  const body = Buffer.concat(parts);
  const len = Buffer.alloc(4);
  len.writeInt32LE(body.length + 5);
  return Buffer.concat([len, body, Buffer.alloc(1)]);
}

/**
 * The error reply to the request requestId: {ok: 0, errmsg, code: 13, codeName: "Unauthorized"} as an OP_MSG
 * (or an OP_REPLY to an OP_QUERY); mongosh and the drivers print errmsg.
 */
export function mongoErrorReply(requestId: number, op: 'msg' | 'query', message: string): Buffer {
  const doc = bson([['ok', 0, 'double'], ['errmsg', message, 'string'], ['code', 13, 'int32'], ['codeName', 'Unauthorized', 'string']]);
  const header = Buffer.alloc(HEADER);
  const rest = op === 'msg' ? Buffer.concat([Buffer.alloc(4), Buffer.from([0]), doc]) : Buffer.concat([Buffer.alloc(4 + 8 + 4), Buffer.from([1, 0, 0, 0]), doc]);
  header.writeInt32LE(HEADER + rest.length, 0);
  header.writeInt32LE(0, 4);
  header.writeInt32LE(requestId, 8);
  header.writeInt32LE(op === 'msg' ? OP_MSG : OP_REPLY, 12);
  return Buffer.concat([header, rest]);
}
