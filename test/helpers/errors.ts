/**
 * The error code a call failed with, for tests that assert which code bad input gets: 'no error' when it did not
 * fail, the GatewayError's code (src/errors.ts) when it did, and a text naming anything else it threw, so that
 * an assertion on the code fails with what really happened.
 */
import { expect } from 'vitest';
import { GatewayError, isGatewayError } from '../../src/errors.js';

const codeOfError = (err: unknown): string => (isGatewayError(err) ? err.code : `not a GatewayError: ${String(err)}`);

/** The code a promise rejects with (or a function: what it throws, or what the promise it returns rejects with). */
export async function codeOf(p: Promise<unknown> | (() => unknown)): Promise<string> {
  try {
    await (typeof p === 'function' ? p() : p);
  } catch (err) {
    return codeOfError(err);
  }
  return 'no error';
}

/** The code a synchronous call throws. */
export function codeOfSync(fn: () => unknown): string {
  try {
    fn();
  } catch (err) {
    return codeOfError(err);
  }
  return 'no error';
}

/** The error a call (or a promise) fails with, asserted to be a GatewayError; a call that succeeds fails the test. */
export async function failureOf(p: Promise<unknown> | (() => Promise<unknown>), what = 'the call'): Promise<GatewayError> {
  try {
    await (typeof p === 'function' ? p() : p);
  } catch (err) {
    expect(err).toBeInstanceOf(GatewayError);
    return err as GatewayError;
  }
  throw new Error(`${what} succeeded`);
}
