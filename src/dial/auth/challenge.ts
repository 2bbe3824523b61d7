/**
 * The challenges of a 407's Proxy-Authenticate headers (RFC 9110 section 11: a comma-separated list of
 * challenges, each an auth-scheme followed by a token68 or by comma-separated auth-params whose values are tokens
 * or quoted-strings). Several headers and several challenges in one header are one list. A pure, bounded parser
 * in the style of src/mux/: it sees the whole header values (the answer head is already bounded to 16 KiB by
 * connect.ts) and throws GW_ERR_DIAL_PROXY_MALFORMED for anything the grammar does not allow, never guessing
 * where a challenge ends.
 */
import { GatewayError } from '../../errors.js';

/** More challenges than this in one answer is not a proxy we talk to. */
export const MAX_CHALLENGES = 16;
/** More auth-params than this in one challenge likewise. */
export const MAX_AUTH_PARAMS = 16;

export interface Challenge {
  /** The scheme as the proxy wrote it ("Digest"). */
  scheme: string;
  /** The scheme lowercased, for comparison (schemes are case-insensitive). */
  key: string;
  /** The token68 form (Negotiate's and NTLM's blobs), if that is what followed the scheme. */
  token68?: string;
  /** auth-params, names lowercased (they are case-insensitive), quoted-string values unescaped. */
  params: ReadonlyMap<string, string>;
}

const TCHAR = /[!#$%&'*+\-.^_`|~0-9A-Za-z]/;
const TOKEN68_CHAR = /[A-Za-z0-9\-._~+/]/;

function malformed(why: string): GatewayError {
  return new GatewayError('GW_ERR_DIAL_PROXY_MALFORMED', `bad Proxy-Authenticate header: ${why}`);
}

/** A cursor over one header value. */
class Scanner {
  i = 0;
  constructor(readonly s: string) {}
  get done(): boolean {
    return this.i >= this.s.length;
  }
  peek(): string {
    return this.s[this.i] ?? '';
  }
  skipSpace(): void {
    while (this.peek() === ' ' || this.peek() === '\t') this.i++;
  }
  skipSpaceAndCommas(): void {
    while (this.peek() === ' ' || this.peek() === '\t' || this.peek() === ',') this.i++;
  }
  token(): string {
    const start = this.i;
    while (!this.done && TCHAR.test(this.peek())) this.i++;
    return this.s.slice(start, this.i);
  }
  quoted(): string {
    this.i++; // the opening quote
    let out = '';
    for (;;) {
      if (this.done) throw malformed('a quoted-string is not closed');
      const c = this.s[this.i++]!;
      if (c === '"') return out;
      if (c === '\\') {
        if (this.done) throw malformed('a quoted-string ends in a backslash');
        out += this.s[this.i++]!;
      } else if (c < ' ' && c !== '\t') {
        throw malformed('a control character in a quoted-string');
      } else out += c;
    }
  }
  /**
   * True when `token BWS "=" BWS (token / quoted-string)` starts here: an auth-param, not a new challenge and not
   * a token68 ("abc==" or a bare "abc=" is a token68, since a parameter's value cannot be empty).
   */
  atParam(): boolean {
    const save = this.i;
    const name = this.token();
    this.skipSpace();
    let yes = false;
    if (name !== '' && this.peek() === '=') {
      this.i++;
      this.skipSpace();
      yes = this.peek() === '"' || (this.peek() !== '' && TCHAR.test(this.peek()));
    }
    this.i = save;
    return yes;
  }
  /** A token68 (letters, digits, -._~+/ then any "="), if one fills the rest of this list element. */
  token68(): string | undefined {
    const save = this.i;
    while (!this.done && TOKEN68_CHAR.test(this.peek())) this.i++;
    if (this.i === save) return undefined;
    while (this.peek() === '=') this.i++;
    const value = this.s.slice(save, this.i);
    this.skipSpace();
    if (this.done || this.peek() === ',') return value;
    this.i = save;
    return undefined;
  }
}

function parseParams(sc: Scanner, scheme: string): Map<string, string> {
  const params = new Map<string, string>();
  for (;;) {
    const name = sc.token().toLowerCase();
    sc.skipSpace();
    if (name === '' || sc.peek() !== '=') throw malformed(`expected an auth-param in the ${scheme} challenge`);
    sc.i++;
    sc.skipSpace();
    const value = sc.peek() === '"' ? sc.quoted() : sc.token();
    if (params.has(name)) throw malformed(`the ${scheme} challenge gives "${name}" twice`);
    if (params.size >= MAX_AUTH_PARAMS) throw malformed(`the ${scheme} challenge has more than ${MAX_AUTH_PARAMS} parameters`);
    params.set(name, value);
    sc.skipSpace();
    if (sc.done) return params;
    if (sc.peek() !== ',') throw malformed(`unexpected ${JSON.stringify(sc.peek())} after "${name}" in the ${scheme} challenge`);
    sc.skipSpaceAndCommas();
    if (sc.done || !sc.atParam()) return params;
  }
}

/** Parses every Proxy-Authenticate value of one answer into one list of challenges, in order. */
export function parseChallenges(values: readonly string[]): Challenge[] {
  const out: Challenge[] = [];
  for (const value of values) {
    const sc = new Scanner(value);
    for (sc.skipSpaceAndCommas(); !sc.done; sc.skipSpaceAndCommas()) {
      const scheme = sc.token();
      if (scheme === '') throw malformed(`expected an auth-scheme at ${JSON.stringify(value.slice(sc.i, sc.i + 20))}`);
      if (out.length >= MAX_CHALLENGES) throw malformed(`more than ${MAX_CHALLENGES} challenges`);
      const challenge: Challenge = { scheme, key: scheme.toLowerCase(), params: new Map() };
      out.push(challenge);
      const spaced = sc.peek() === ' ' || sc.peek() === '\t';
      sc.skipSpace();
      if (sc.done || sc.peek() === ',') continue;
      if (!spaced) throw malformed(`no space after the auth-scheme "${scheme}"`);
      if (!sc.atParam()) {
        const t68 = sc.token68();
        if (t68 === undefined) throw malformed(`the ${scheme} challenge is neither a token68 nor auth-params`);
        challenge.token68 = t68;
        continue;
      }
      challenge.params = parseParams(sc, scheme);
    }
  }
  return out;
}

/** The schemes offered, as written, without repeats: for messages ("Digest, Basic"). */
export function offeredSchemes(challenges: readonly Challenge[]): string[] {
  const seen = new Map<string, string>();
  for (const c of challenges) if (!seen.has(c.key)) seen.set(c.key, c.scheme);
  return [...seen.values()];
}

const BASE64 = /^[A-Za-z0-9+/]+={0,2}$/;

/**
 * The token of a Negotiate or NTLM challenge: undefined for the bare scheme name, null when what follows is not a
 * strict base64 token68 (Buffer.from would skip junk), is auth-params, or is longer than `maxLength` characters.
 */
export function base64Token(c: Challenge, maxLength: number): string | undefined | null {
  if (c.token68 === undefined) return c.params.size === 0 ? undefined : null;
  const t = c.token68;
  return t.length <= maxLength && t.length % 4 === 0 && BASE64.test(t) ? t : null;
}
