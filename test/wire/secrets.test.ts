/**
 * The secrets of a sign-in as both ends make and check them (src/wire/secrets.ts): gwsh sends sha256hex of its
 * secret first and the secret later; the Auth Service takes the secret only when it hashes to what came first.
 */
import { createHash } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { randomSecret, sameSecret, sha256hex } from '../../src/wire/secrets.js';

describe('secrets', () => {
  it('a secret is 32 random bytes in base64url (43 characters), a new one each time', () => {
    const a = randomSecret();
    expect(a).toMatch(/^[A-Za-z0-9_-]{43}$/);
    expect(Buffer.from(a, 'base64url')).toHaveLength(32);
    expect(randomSecret()).not.toBe(a);
  });

  it('its hash is the hex SHA-256 of its UTF-8 bytes', () => {
    expect(sha256hex('é')).toBe(createHash('sha256').update(Buffer.from('é', 'utf8')).digest('hex'));
  });

  it('sameSecret takes the secret whose hash was sent, and nothing else', () => {
    const secret = randomSecret();
    const hash = sha256hex(secret);
    expect(sameSecret(secret, hash)).toBe(true);
    expect(sameSecret(`${secret}x`, hash)).toBe(false);
    expect(sameSecret(secret, undefined)).toBe(false);
    expect(sameSecret(secret, hash.slice(0, 32))).toBe(false);
    expect(sameSecret(secret, 'not hex')).toBe(false);
  });
});
