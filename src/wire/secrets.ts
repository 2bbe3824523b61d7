/**
 * Secrets as both ends of a sign-in make and check them: 32 random bytes, base64url, and their hex SHA-256, which
 * is what is stored or sent ahead instead of the secret. gwsh's console sign-in sends the hash of its secret first
 * and the secret at the exchange (src/cli/gwsh.ts); the Auth Service checks one against the other (src/auth/sso/),
 * as it does a web session's id and bearer (src/auth/websessions.ts). Both must hash alike, so both import these.
 */
import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';

/** The hex SHA-256 under which a secret (session ID, bearer, SSO state, one-time code) is stored: never the secret. */
export function sha256hex(text: string): string {
  return createHash('sha256').update(text, 'utf8').digest('hex');
}

/** A new secret: 32 random bytes, base64url (43 characters). */
export function randomSecret(): string {
  return randomBytes(32).toString('base64url');
}

/** Whether given is the secret whose sha256hex is storedHash, in constant time. */
export function sameSecret(given: string, storedHash: string | undefined): boolean {
  if (storedHash === undefined) return false;
  const a = Buffer.from(sha256hex(given), 'hex');
  const b = Buffer.from(storedHash, 'hex');
  return a.length === b.length && timingSafeEqual(a, b);
}
