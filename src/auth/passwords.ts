/**
 * Local users' passwords: scrypt (memory-hard), parameters stored with each hash so they can be raised later.
 * Verification takes the same time whether or not the user exists (a dummy hash is checked for unknown users).
 */
import { randomBytes, scrypt as scryptCb, timingSafeEqual, type ScryptOptions } from 'node:crypto';
import { GatewayError } from '../errors.js';

const PARAMS = { N: 1 << 15, r: 8, p: 1 } as const;
const KEY_LEN = 32;
export const MIN_PASSWORD_LENGTH = 8;
export const MAX_PASSWORD_LENGTH = 1024;

function scrypt(password: string, salt: Buffer, params: { N: number; r: number; p: number }): Promise<Buffer> {
  const options: ScryptOptions = { ...params, maxmem: 128 * params.N * params.r * 2 };
  return new Promise((resolve, reject) =>
    scryptCb(password.normalize('NFKC'), salt, KEY_LEN, options, (err, key) => (err ? reject(err) : resolve(key))),
  );
}

export function checkPasswordPolicy(password: string): void {
  if (password.length < MIN_PASSWORD_LENGTH) {
    throw new GatewayError('GW_ERR_AUTH_WEAK_PASSWORD', `the password is shorter than ${MIN_PASSWORD_LENGTH} characters`);
  }
  if (password.length > MAX_PASSWORD_LENGTH) {
    throw new GatewayError('GW_ERR_AUTH_WEAK_PASSWORD', `the password is longer than ${MAX_PASSWORD_LENGTH} characters`);
  }
}

/** "scrypt$N$r$p$<salt b64>$<hash b64>" */
export async function hashPassword(password: string): Promise<string> {
  checkPasswordPolicy(password);
  const salt = randomBytes(16);
  const key = await scrypt(password, salt, PARAMS);
  return ['scrypt', PARAMS.N, PARAMS.r, PARAMS.p, salt.toString('base64'), key.toString('base64')].join('$');
}

let dummy: Promise<string> | undefined;

/** True when password matches stored; stored undefined (unknown user) costs the same and returns false. */
export async function verifyPassword(password: string, stored: string | undefined): Promise<boolean> {
  const encoded = stored ?? (await (dummy ??= hashPassword('dummy-password-for-timing')));
  const parts = encoded.split('$');
  if (parts.length !== 6 || parts[0] !== 'scrypt') return false;
  const [N, r, p] = parts.slice(1, 4).map(Number) as [number, number, number];
  const salt = Buffer.from(parts[4]!, 'base64');
  const expected = Buffer.from(parts[5]!, 'base64');
  if (password.length > MAX_PASSWORD_LENGTH) return false;
  const key = await scrypt(password, salt, { N, r, p });
  return stored !== undefined && key.length === expected.length && timingSafeEqual(key, expected);
}
