/**
 * Basic (RFC 7617): user:password in base64, UTF-8. The weakest scheme: the password crosses the connection to
 * the proxy, so it is sent only when the proxy offers nothing stronger this client can do (scheme.ts), and
 * pre-emptively only to a proxy that asked for Basic on an earlier dial of the same Dialer (dialer.ts).
 */
import type { ProxySpec } from '../select.js';
import type { AuthSession, ProxyAuthScheme } from './types.js';

export function basicCredentials(username: string, password: string): string {
  return `Basic ${Buffer.from(`${username}:${password}`, 'utf8').toString('base64')}`;
}

export const basicScheme: ProxyAuthScheme = {
  name: 'Basic',
  strength: 10,
  connectionBound: false,
  preemptive: true,
  can: (proxy: ProxySpec) =>
    proxy.username === undefined
      ? { ok: false, why: 'needs user:password in the proxy URL' }
      : { ok: true, why: `user "${proxy.username}" from the proxy URL` },
  accepts: () => true,
  start(proxy: ProxySpec): AuthSession {
    let sent = false;
    return {
      respond: async () => {
        // One answer only: a second 407 means the proxy refused it.
        if (sent) return undefined;
        sent = true;
        return basicCredentials(proxy.username ?? '', proxy.password ?? '');
      },
    };
  },
};
