/**
 * The error a dial fails with, for the tests of the Dialer's refusals (proxies that refuse, lie or stall): a
 * GatewayError, asserted to be one; a dial that succeeds fails the test.
 */
import { expect } from 'vitest';
import type { Dialer } from '../../src/dial/dialer.js';
import { GatewayError } from '../../src/errors.js';

export async function dialError(d: Pick<Dialer, 'dial'>, target: string): Promise<GatewayError> {
  try {
    (await d.dial(target)).destroy();
  } catch (err) {
    expect(err).toBeInstanceOf(GatewayError);
    return err as GatewayError;
  }
  throw new Error(`dial ${target} unexpectedly succeeded`);
}
