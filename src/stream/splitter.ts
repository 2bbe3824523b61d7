/**
 * Newline-delimited lines out of a byte stream, a chunk at a time. Pure and bounded: the splitter holds at most
 * `maxBytes` bytes (the unfinished line), and a line (without its '\n') longer than `maxBytes` is refused
 * with a GatewayError GW_ERR_TUNNEL_PROTOCOL (and nothing else) as soon as that is certain, even before its
 * '\n' arrives. After that every later feed throws the same error: nothing more is buffered.
 *
 *   feed(chunk)  { kind: 'need-more' }                  the chunk (no '\n' in it) was kept as part of a line,
 *                { kind: 'line', line, rest }            the next complete line, and the bytes of chunk after its
 *                                                        '\n', not kept: feed them next, or hand them on unread;
 *   lines(chunk) every complete line the chunk finishes, in order (feeds the rests itself).
 *
 * Lines are bytes: a UTF-8 character split across two chunks comes out whole.
 */
import { GatewayError } from '../errors.js';

export type LineResult = { kind: 'need-more' } | { kind: 'line'; line: Buffer; rest: Buffer };

export class LineSplitter {
  private parts: Buffer[] = [];
  private held = 0;
  private failure: GatewayError | undefined;

  /** what names the lines in the error ("control line", "dial request"). */
  constructor(
    readonly maxBytes: number,
    readonly what = 'line',
  ) {}

  /** Bytes held of the unfinished line (at most maxBytes). */
  get pending(): number {
    return this.held;
  }

  feed(chunk: Buffer): LineResult {
    if (this.failure) throw this.failure;
    const nl = chunk.indexOf(0x0a);
    const take = nl < 0 ? chunk.length : nl;
    if (this.held + take > this.maxBytes) {
      this.parts = [];
      this.held = 0;
      this.failure = new GatewayError('GW_ERR_TUNNEL_PROTOCOL', `${this.what} longer than ${this.maxBytes} bytes`);
      throw this.failure;
    }
    if (nl < 0) {
      if (chunk.length > 0) this.parts.push(Buffer.from(chunk)); // a copy: a view would keep the caller's whole buffer
      this.held += chunk.length;
      return { kind: 'need-more' };
    }
    const head = chunk.subarray(0, nl);
    const line = this.parts.length === 0 ? head : Buffer.concat([...this.parts, head]);
    this.parts = [];
    this.held = 0;
    return { kind: 'line', line, rest: chunk.subarray(nl + 1) };
  }

  lines(chunk: Buffer): Buffer[] {
    const out: Buffer[] = [];
    let result = this.feed(chunk);
    while (result.kind === 'line') {
      out.push(result.line);
      result = this.feed(result.rest);
    }
    return out;
  }
}
