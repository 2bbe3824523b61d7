/**
 * What "ready" means for each role (docs/operations.md, "Health"), as checks src/net/health.ts runs on a schedule
 * and /readyz of the diagnostics listener (src/net/diag.ts) reports by name:
 *
 *   backend          Auth Service (and a Proxy next to it): a read of one key, within the check's deadline. It is
 *                    the cheapest query that goes to the storage (PostgreSQL: a round trip on the pool).
 *   auth             Proxy: the Auth Service answers. Next to it in this process: it is the in-process one (its
 *                    storage is the backend check); a Proxy of its own: a GET /webapi/ca of the Auth API, through
 *                    the same client (and failover across auth_server addresses) as its real calls.
 *   listener <name>  Proxy: each bound listener of the front door is listening. The listen state, not a local
 *                    connect: a connect would count as a client in the listener's caps and counters and wait out
 *                    the multiplexer's detect deadline each round; the event loop's answer is /healthz's, and
 *                    the path past the listener is the probe's (`gwctl probe`).
 *   tunnel           agent: it holds a tunnel to at least one Proxy (the pool's state is connected).
 *   <kind> <name>    agent: each resource a bare connect cannot hurt answers (roles/agent.ts says which: PostgreSQL,
 *                    Redis and MongoDB databases, HTTP(S) apps, API servers): a TCP connect to its address, closed
 *                    at once (src/agent/resources.ts resourceReach); a direct-join agent's SSH listener likewise.
 *                    The SSH Service of a tunnel agent runs in this process (/healthz).
 *
 * Also here, the one rule of where the diagnostics listener may not be: on a public listener's address.
 */
import net from 'node:net';
import { formatHostPort, parseAddr, type HostPort } from '../addr.js';
import type { Backend } from '../backend/index.js';
import type { GatewayConfig, ServiceName } from '../config/index.js';
import { GatewayError } from '../errors.js';
import type { HealthCheck } from '../net/health.js';
import type { ServiceKind } from '../tunnel/protocol.js';

/** The key the backend check reads (absent: the read still goes to the storage). */
export const HEALTH_KEY = 'health/readyz';

export interface ReadinessSources {
  backend?: Pick<Backend, 'get'>;
  /** A Proxy of its own process: asks its Auth Service (RemoteProxyAuth.call). */
  remoteAuth?: { call<T>(method: string, path: string): Promise<T> };
  /** A Proxy next to its Auth Service. */
  localAuth?: boolean;
  listeners?: () => Array<{ name: string; address: string; listening: boolean }>;
  /** An agent's tunnels. */
  tunnel?: { getState(): string; links(): string[] };
  /** An agent's resources, and how to reach each. */
  resources?: Array<{ kind: ServiceKind; name: string }>;
  reach?: (kind: ServiceKind, name: string, timeoutMs: number) => Promise<number>;
  /** A direct-join agent's SSH listener, host:port. */
  sshListener?: { check: (timeoutMs: number) => Promise<number> };
  /** Each check's deadline (the resource connects get it too). */
  timeoutMs: number;
}

export function readinessChecks(s: ReadinessSources): HealthCheck[] {
  const checks: HealthCheck[] = [];
  const { backend, remoteAuth, listeners, tunnel, reach } = s;
  if (backend) checks.push({ name: 'backend', run: async () => void (await backend.get(HEALTH_KEY)) });
  if (remoteAuth) checks.push({ name: 'auth', run: async () => void (await remoteAuth.call('GET', '/webapi/ca')) });
  else if (s.localAuth) checks.push({ name: 'auth', run: async () => 'in this process' });
  if (listeners) {
    for (const l of listeners()) {
      checks.push({
        name: `listener ${l.name}`,
        run: async () => {
          const now = listeners().find((x) => x.name === l.name);
          if (!now?.listening) throw new Error(`${l.name} (${l.address}) is not listening`);
          return now.address;
        },
      });
    }
  }
  if (tunnel) {
    checks.push({
      name: 'tunnel',
      run: async () => {
        const links = tunnel.links();
        if (tunnel.getState() !== 'connected' || links.length === 0) throw new Error(`no tunnel to a Proxy (reverse tunnel ${tunnel.getState()})`);
        return `${links.length} Proxy tunnel${links.length === 1 ? '' : 's'}`;
      },
    });
  }
  if (reach) {
    for (const r of s.resources ?? []) {
      checks.push({ name: `${r.kind} ${r.name}`, run: async () => `connected in ${Math.round(await reach(r.kind, r.name, s.timeoutMs))} ms` });
    }
  }
  if (s.sshListener) {
    const ssh = s.sshListener;
    checks.push({ name: 'ssh listener', run: async () => `connected in ${Math.round(await ssh.check(s.timeoutMs))} ms` });
  }
  return checks;
}

/**
 * GW_ERR_DIAG_ADDR_PUBLIC when the diagnostics listener would share an address with a public listener of the
 * services that run (the same port, and the same host or either bound to every interface). Port 0 is never a clash.
 */
export function checkDiagAddr(config: GatewayConfig, services: readonly ServiceName[]): void {
  const diag = config.gateway.diag_addr;
  if (!diag || diag.port === 0) return;
  for (const [key, addr] of publicListeners(config, services)) {
    if (addr.port !== diag.port) continue;
    if (addr.host === diag.host || wildcard(addr.host) || wildcard(diag.host)) {
      throw new GatewayError('GW_ERR_DIAG_ADDR_PUBLIC', `the diagnostics listener ${formatHostPort(diag.host, diag.port)} is the address of ${key} (${formatHostPort(addr.host, addr.port)}): never on the public port`, {
        hint: `Give --diag-addr (gateway.diag_addr) a port no public listener uses, on an address only the supervisor reaches, e.g. 127.0.0.1:3000.`,
      });
    }
  }
}

function wildcard(host: string): boolean {
  return host === '0.0.0.0' || host === '::' || host === '';
}

/** Every `*listen_addr` of the sections of the services that run: what clients, agents and peers connect to. */
function publicListeners(config: GatewayConfig, services: readonly ServiceName[]): Array<[string, HostPort]> {
  const out: Array<[string, HostPort]> = [];
  for (const service of services) {
    const section = (config as unknown as Record<string, Record<string, unknown> | undefined>)[service];
    for (const [key, value] of Object.entries(section ?? {})) {
      if (!key.endsWith('listen_addr') || typeof value !== 'object' || value === null) continue;
      const v = value as Partial<HostPort>;
      if (typeof v.host === 'string' && typeof v.port === 'number') out.push([`${service}.${key}`, { host: v.host, port: v.port }]);
    }
  }
  return out;
}

/** A TCP connect to host:port within timeoutMs, closed at once; resolves with the connect time in ms. */
export function reachTcp(address: string, timeoutMs: number): Promise<number> {
  const { host, port } = parseAddr(address);
  const started = performance.now();
  return new Promise((resolve, reject) => {
    const socket = net.connect({ host: host === '0.0.0.0' || host === '::' ? '127.0.0.1' : host, port: port ?? 0 });
    const timer = setTimeout(() => {
      socket.destroy();
      reject(new Error(`${address}: no connection within ${timeoutMs} ms`));
    }, timeoutMs);
    socket.once('connect', () => {
      clearTimeout(timer);
      socket.destroy();
      resolve(performance.now() - started);
    });
    socket.once('error', (err: NodeJS.ErrnoException) => {
      clearTimeout(timer);
      reject(new Error(`${address}: ${err.code ?? err.message}`));
    });
  });
}
