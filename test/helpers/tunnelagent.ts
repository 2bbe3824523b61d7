import net from 'node:net';
import type { HostIdentity } from '../../src/agent/identity.js';
import type { TunnelAgentOptions } from '../../src/agent/tunnel.js';
import { Dialer } from '../../src/dial/dialer.js';

/**
 * A TunnelAgent's options as the tunnel tests use them: a database agent whose one database, "pg", is the echo
 * server given, no proxy variables, quick retries; `extra` overrides any of them.
 */
export function echoAgentOptions(identity: HostIdentity, echo: net.Server, extra: Partial<TunnelAgentOptions> = {}): TunnelAgentOptions {
  return {
    identity,
    dialer: new Dialer({ env: {} }),
    services: ['db'],
    resources: { databases: [{ name: 'pg', protocol: 'postgres', labels: {} }], apps: [], desktops: [], kube_clusters: [] },
    connectResource: async () => net.connect((echo.address() as net.AddressInfo).port, '127.0.0.1'),
    backoff: { firstMs: 50, maxMs: 200 },
    ...extra,
  };
}
