/**
 * --diag-addr, as `gateway start` and `gateway-kube-updater` take it: host:port, port 3000 when left out (as
 * gateway.diag_addr); a usage error naming the flag otherwise. Its own file so that the updater does not load the
 * daemon to parse one flag.
 */
import { parseAddr, type AddrError } from '../addr.js';
import { GatewayError } from '../errors.js';

/** --diag-addr: host:port (3000 when the port is left out, as gateway.diag_addr). */
export function diagAddrOf(value: string): { host: string; port: number } {
  try {
    const addr = parseAddr(value);
    return { host: addr.host, port: addr.port ?? 3000 };
  } catch (err) {
    throw new GatewayError('GW_ERR_USAGE', `--diag-addr: "${value}" is not host:port (${(err as Error).message})`, {
      hint: (err as AddrError).hint ?? 'Give an address only the supervisor reaches, e.g. --diag-addr=127.0.0.1:3000.',
    });
  }
}
