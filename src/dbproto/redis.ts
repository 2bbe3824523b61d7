/**
 * The Redis client's commands, as the agent follows them to check the database user (RESP2/RESP3 requests:
 * an array of bulk strings, or an inline command line). Pure, bounded and incremental: RedisCommandScanner.push
 * takes each chunk the client sends and answers events with offsets in that chunk:
 *
 *   { kind: 'start', at }                  a command begins at this byte;
 *   { kind: 'ready', at, name, user? }     from this byte on, the command is known: for AUTH and HELLO (and
 *                                          RESET) once the whole command is in, with the user it names; for
 *                                          every other command as soon as its name is in;
 *   { kind: 'invalid', at, reason }        not a request the agent can follow: it stops there.
 *
 * What it holds: at most the first REDIS_MAX_NAME_BYTES of a command's name, and the arguments of AUTH and
 * HELLO up to REDIS_MAX_AUTH_BYTES in all; a value of any other command is counted through, never kept.
 *
 * The users (as the server reads them): `AUTH password` is the user "default", `AUTH user password` the user;
 * `HELLO protover [AUTH user password] [SETNAME name]` the user after AUTH, read in the server's order; RESET
 * goes back to "default"; a command with other arguments names no user (the server refuses it). An inline
 * command (not an array) with a quote or a backslash is refused: the server reads quotes there (sdssplitargs), and
 * the scanner would not read the same name.
 */

export const REDIS_MAX_NAME_BYTES = 64;
export const REDIS_MAX_AUTH_BYTES = 64 * 1024;
/** Redis' own limits: an inline request of 64 KiB, a bulk string of 512 MB, a multibulk of 1M elements... */
export const REDIS_MAX_INLINE_BYTES = 64 * 1024;
export const REDIS_MAX_BULK_BYTES = 512 * 1024 * 1024;
export const REDIS_MAX_ARRAY = 1024 * 1024;
/** ...and the longest length line ("*1048576\r\n" and "$536870912\r\n" fit). */
const MAX_LENGTH_LINE = 16;

export type RedisEvent =
  | { kind: 'start'; at: number }
  | { kind: 'ready'; at: number; name: string; user?: string }
  | { kind: 'invalid'; at: number; reason: string };

type State = 'start' | 'array-len' | 'bulk-len' | 'bulk-data' | 'inline';

const AUTH_LIKE = new Set(['auth', 'hello', 'reset']);

/** The user an AUTH, HELLO or RESET names (args without the command's name), or undefined for none. */
export function redisCommandUser(name: string, args: readonly string[]): string | undefined {
  if (name === 'reset') return 'default';
  if (name === 'auth') return args.length === 1 ? 'default' : args.length === 2 ? args[0] : undefined;
  if (name !== 'hello') return undefined;
  let user: string | undefined;
  // The server's order (hello's loop): args[0] is the protocol version, then options.
  for (let j = 1; j < args.length; j++) {
    const more = args.length - 1 - j;
    const opt = args[j]!.toLowerCase();
    if (opt === 'auth' && more >= 2) {
      user = args[j + 1];
      j += 2;
    } else if (opt === 'setname' && more >= 1) {
      j += 1;
    } else {
      return undefined; // the server refuses the whole HELLO: nobody is authenticated by it
    }
  }
  return user;
}

export class RedisCommandScanner {
  private state: State = 'start';
  private line = '';
  private elements = 0;
  private index = 0;
  private remaining = 0;
  private bulkLen = 0;
  private name = '';
  private element = '';
  private args: string[] = [];
  private kept = 0;
  private stopped = false;

  push(chunk: Buffer): RedisEvent[] {
    const events: RedisEvent[] = [];
    let at = 0;
    while (at < chunk.length && !this.stopped) {
      const next = this.step(chunk, at, events);
      if (next === undefined) this.stopped = true;
      else at = next;
    }
    return events;
  }

  /** Consumes bytes from at; returns where it stopped, or undefined after an invalid event. */
  private step(chunk: Buffer, at: number, events: RedisEvent[]): number | undefined {
    const fail = (reason: string) => {
      events.push({ kind: 'invalid', at, reason });
      return undefined;
    };
    switch (this.state) {
      case 'start': {
        const b = chunk[at]!;
        if (b === 0x0d || b === 0x0a) return at + 1; // empty lines between commands: the server skips them
        events.push({ kind: 'start', at });
        this.name = '';
        this.args = [];
        this.kept = 0;
        this.line = '';
        if (b === 0x2a /* '*' */) {
          this.state = 'array-len';
          return at + 1;
        }
        this.state = 'inline';
        return at;
      }
      case 'array-len':
      case 'bulk-len':
        return this.lengthLine(chunk, at, events, fail);
      case 'bulk-data':
        return this.bulkData(chunk, at, events);
      case 'inline':
        return this.inline(chunk, at, events, fail);
    }
  }

  private lengthLine(chunk: Buffer, at: number, events: RedisEvent[], fail: (r: string) => undefined): number | undefined {
    const nl = chunk.indexOf(0x0a, at);
    const end = nl < 0 ? chunk.length : nl;
    this.line += chunk.toString('latin1', at, end);
    if (this.line.length > MAX_LENGTH_LINE) return fail('a length line that is too long');
    if (nl < 0) return chunk.length;
    // The server ends these lines at "\r" and expects "\n" after it; a bare "\n" it would read otherwise.
    if (!this.line.endsWith('\r')) return fail('a length line that does not end with CRLF');
    const text = this.line.slice(0, -1);
    this.line = '';
    if (this.state === 'array-len') {
      if (!/^-?\d+$/.test(text)) return fail('a multibulk length that is not a number');
      const n = Number(text);
      if (n > REDIS_MAX_ARRAY) return fail(`a multibulk of ${n} elements`);
      if (n <= 0) {
        this.state = 'start';
        return nl + 1;
      }
      [this.elements, this.index, this.state] = [n, 0, 'bulk-len'];
      return nl + 1;
    }
    if (!/^\$\d+$/.test(text)) return fail("a multibulk element that is not a bulk string ('$' and a length)");
    const len = Number(text.slice(1));
    if (len > REDIS_MAX_BULK_BYTES) return fail(`a bulk string of ${len} bytes`);
    if (this.index > 0 && AUTH_LIKE.has(this.name) && (this.kept += len) > REDIS_MAX_AUTH_BYTES) return fail(`a ${this.name.toUpperCase()} longer than ${REDIS_MAX_AUTH_BYTES} bytes`);
    [this.remaining, this.bulkLen, this.element, this.state] = [len + 2, len, '', 'bulk-data'];
    return nl + 1;
  }

  private bulkData(chunk: Buffer, at: number, events: RedisEvent[]): number {
    const take = Math.min(this.remaining, chunk.length - at);
    // The value is bulkLen bytes; the 2 after it (CRLF) are skipped unread, as the server skips them.
    const valueLeft = Math.max(0, this.remaining - 2);
    const room = this.index === 0 ? REDIS_MAX_NAME_BYTES - this.element.length : AUTH_LIKE.has(this.name) ? valueLeft : 0;
    const keep = Math.min(take, valueLeft, Math.max(0, room));
    if (keep > 0) this.element += chunk.toString('latin1', at, at + keep);
    this.remaining -= take;
    const end = at + take;
    if (this.remaining > 0) return end;
    if (this.index === 0) {
      // A name longer than REDIS_MAX_NAME_BYTES is no command the scanner looks into (nor one the server knows).
      this.name = this.bulkLen > REDIS_MAX_NAME_BYTES ? '' : this.element.toLowerCase();
      if (!AUTH_LIKE.has(this.name)) events.push({ kind: 'ready', at: end, name: this.name });
    } else if (AUTH_LIKE.has(this.name)) {
      this.args.push(Buffer.from(this.element, 'latin1').toString('utf8'));
    }
    this.index++;
    if (this.index < this.elements) {
      this.state = 'bulk-len';
      return end;
    }
    if (AUTH_LIKE.has(this.name)) events.push(this.ready(end));
    this.state = 'start';
    return end;
  }

  private inline(chunk: Buffer, at: number, events: RedisEvent[], fail: (r: string) => undefined): number | undefined {
    const nl = chunk.indexOf(0x0a, at);
    const end = nl < 0 ? chunk.length : nl;
    this.line += chunk.toString('latin1', at, end);
    if (this.line.length > REDIS_MAX_INLINE_BYTES) return fail(`an inline command longer than ${REDIS_MAX_INLINE_BYTES} bytes`);
    if (nl < 0) return chunk.length;
    if (/["'\\]/.test(this.line)) return fail('an inline command with quotes or backslashes (send it as a RESP array)');
    const words = this.line.split(/[ \t\r]+/).filter((w) => w !== '');
    this.line = '';
    this.state = 'start';
    this.name = (words[0] ?? '').toLowerCase();
    this.args = words.slice(1).map((w) => Buffer.from(w, 'latin1').toString('utf8'));
    events.push(AUTH_LIKE.has(this.name) ? this.ready(nl + 1) : { kind: 'ready', at: nl + 1, name: this.name });
    return nl + 1;
  }

  private ready(at: number): RedisEvent {
    const user = redisCommandUser(this.name, this.args);
    return user === undefined ? { kind: 'ready', at, name: this.name } : { kind: 'ready', at, name: this.name, user };
  }
}

/** An error reply the client prints: `-NOPERM GW_ERR_...: message`. Line breaks are replaced (a reply is one line). */
export function redisErrorReply(message: string): Buffer {
  return Buffer.from(`-NOPERM ${message.replace(/[\r\n]+/g, ' ')}\r\n`, 'utf8');
}
