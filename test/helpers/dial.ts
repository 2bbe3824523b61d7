/**
 * The error a dial fails with, for the tests of the Dialer's refusals (proxies that refuse, lie or stall): a
 * GatewayError, asserted to be one; a dial that succeeds fails the test.
 */
import type { Dialer } from '../../src/dial/dialer.js';
import type { GatewayError } from '../../src/errors.js';
import { failureOf } from './errors.js';

export function dialError(d: Pick<Dialer, 'dial'>, target: string): Promise<GatewayError> {
  return failureOf(async () => (await d.dial(target)).destroy(), `dial ${target}`);
}
