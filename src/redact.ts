/**
 * Secrets (proxy passwords, tokens, keys) never reach a log line or an error message. These helpers are the
 * one place that decides how a secret is shown: as "***".
 */

export const REDACTED = '***';

/**
 * Splits "scheme://userinfo@rest" (scheme and userinfo optional). Userinfo runs to the LAST "@", so a password
 * with an unencoded "@" or "/" is still taken whole rather than leaking into the host part.
 */
export function splitUserinfo(value: string): { scheme?: string; userinfo?: string; rest: string } {
  const m = /^([a-z][a-z0-9+.-]*):\/\//i.exec(value);
  const scheme = m ? m[1] : undefined;
  const afterScheme = m ? value.slice(m[0].length) : value;
  const at = afterScheme.lastIndexOf('@');
  if (at < 0) return { ...(scheme === undefined ? {} : { scheme }), rest: afterScheme };
  return {
    ...(scheme === undefined ? {} : { scheme }),
    userinfo: afterScheme.slice(0, at),
    rest: afterScheme.slice(at + 1),
  };
}

/** The value as written, with everything after the first ":" of its userinfo replaced by "***". */
export function redactUserinfo(value: string): string {
  const { scheme, userinfo, rest } = splitUserinfo(value);
  if (userinfo === undefined) return value;
  const colon = userinfo.indexOf(':');
  const shown = colon < 0 ? userinfo : `${userinfo.slice(0, colon)}:${REDACTED}`;
  return `${scheme === undefined ? '' : `${scheme}://`}${shown}@${rest}`;
}

/** A URL string with any password replaced by "***" (the user name stays: operators need it to debug). */
export function redactUrl(url: string | URL): string {
  return redactUserinfo(typeof url === 'string' ? url : url.href);
}

/** Replaces every occurrence of each secret in text (secrets shorter than 3 characters are not searched for). */
export function redactSecrets(text: string, secrets: Iterable<string>): string {
  let out = text;
  for (const secret of secrets) {
    if (!secret || secret.length < 3) continue;
    out = out.split(secret).join(REDACTED);
  }
  return out;
}
