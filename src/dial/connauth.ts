/**
 * The shape of a connection-bound proxy authentication scheme (NTLM in ntlm.ts, Negotiate in negotiate.ts): a
 * token exchange that must happen on one kept-alive connection to the proxy, before the CONNECT is let through.
 * A scheme does no I/O of its own: whoever speaks HTTP to the proxy sends `first()` as the Proxy-Authorization of
 * the first CONNECT, gives `next()` the proxy's Proxy-Authenticate value for this scheme from each 407, and sends
 * what it returns, on the same connection. A scheme that has nothing more to say (it has already answered, or the
 * proxy's 407 carries the bare scheme name after an answer: the proxy refused it) throws a GatewayError.
 */

export interface ConnectionAuthScheme {
  /** The scheme's name as it appears in Proxy-Authenticate and Proxy-Authorization ('NTLM', 'Negotiate'). */
  readonly name: string;
  /** The first Proxy-Authorization value ("NTLM TlRMTVNT..."). */
  first(): Promise<string>;
  /** The next Proxy-Authorization value for the proxy's Proxy-Authenticate value ("NTLM <challenge>"). */
  next(challenge: string): Promise<string>;
}

const BASE64 = /^[A-Za-z0-9+/]+={0,2}$/;

/**
 * The token of a Proxy-Authenticate value of `scheme` ("NTLM abc=" -> "abc="): undefined when the value is the bare
 * scheme name, null when it is another scheme's or the token is not base64 (strict: Buffer.from would skip junk).
 * At most `maxLength` characters of token are accepted.
 */
export function schemeToken(value: string, scheme: string, maxLength: number): string | undefined | null {
  const v = value.trim();
  const space = v.indexOf(' ');
  const name = space < 0 ? v : v.slice(0, space);
  if (name.toLowerCase() !== scheme.toLowerCase()) return null;
  if (space < 0) return undefined;
  const token = v.slice(space + 1).trim();
  if (token === '') return undefined;
  if (token.length > maxLength || token.length % 4 !== 0 || !BASE64.test(token)) return null;
  return token;
}
