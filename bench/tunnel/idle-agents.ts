/**
 * bench:tunnel's idle agents, a child process's entry: real TunnelAgent instances (each its own host identity,
 * joined through POST /webapi/join) connected to the idle-memory Proxy, each from its own loopback source addresses.
 * bench/tunnel/idle.ts starts BENCH_AGENT_PROCS of these and asks them over IPC (ToChild / FromChild) to join,
 * connect a count, and report; a disconnect stops the agents and exits.
 */
import net from 'node:net';
import type { HostIdentity } from '../../src/agent/identity.js';
import { TunnelAgent } from '../../src/agent/tunnel.js';
import { parseAddr } from '../../src/addr.js';
import { generateKeyPair, identityFromCert } from '../../src/auth/pki.js';
import type { CertBundle } from '../../src/auth/service.js';
import { ApiClient, fetchPinnedCas } from '../../src/client/api.js';
import { Dialer } from '../../src/dial/dialer.js';
import { createLogger, setRootLogger } from '../../src/log.js';
import { withTimeout } from '../common.js';
import { AGENTS_PER_SOURCE, PROXY_IP, PROXY_NAME } from './settings.js';

/**
 * The direct leg of the Dialer (TCP, Nagle off, keep-alive, half-close) from a chosen loopback source address, and
 * the Proxy's name resolved as only squid's hosts file does. Everything above the TCP connection (TLS, the
 * tunnel) is the product's.
 */
class SourceDialer extends Dialer {
  constructor(private readonly source: string) {
    super({ env: {} });
  }

  override dial(target: Parameters<Dialer['dial']>[0]): Promise<net.Socket> {
    const { host, port } = typeof target === 'string' ? parseAddr(target) : target;
    return new Promise((resolve, reject) => {
      const s = net.connect({ host: host === PROXY_NAME ? PROXY_IP : host, port: Number(port), localAddress: this.source, noDelay: true, allowHalfOpen: true, keepAlive: true, keepAliveInitialDelay: 30_000 });
      s.once('error', reject);
      s.once('connect', () => {
        s.off('error', reject);
        resolve(s);
      });
    });
  }
}

/** A request from the bench; each is answered once, with done or error. */
export type ToChild =
  | { op: 'join'; addr: string; token: string; pin: string; names: string[]; sourceBase: string; concurrency: number }
  | { op: 'connect'; count: number; concurrency: number }
  | { op: 'check' };
/** The answer: how long the request took and how many of this process's agents are connected. */
export type FromChild = { op: 'done'; ms: number; connected: number; total: number } | { op: 'error'; message: string };

/** Runs fn over items with at most `concurrency` in flight. */
async function pool<T>(items: T[], concurrency: number, fn: (item: T, worker: number) => Promise<void>): Promise<void> {
  let next = 0;
  await Promise.all(
    Array.from({ length: Math.min(concurrency, items.length) }, async (_, worker) => {
      for (let i = next++; i < items.length; i = next++) await fn(items[i]!, worker);
    }),
  );
}

/** The child's side: joins its identities, then starts their agents on request; answers each request once. */
async function idleAgentsChild(): Promise<void> {
  const identities: HostIdentity[] = [];
  const agents: TunnelAgent[] = [];
  let sourceBase = '127.1.0';
  const send = (m: FromChild) => process.send!(m);
  const status = (t0: number): FromChild => ({ op: 'done', ms: Date.now() - t0, connected: agents.filter((a) => a.getState() === 'connected').length, total: agents.length });
  const join = async (m: Extract<ToChild, { op: 'join' }>) => {
    sourceBase = m.sourceBase;
    // Joins come from their own addresses (one per worker): failed joins are limited per source.
    const joinDialers = Array.from({ length: m.concurrency }, (_, w) => new SourceDialer(`${m.sourceBase}.${200 + w}`));
    const cas = await fetchPinnedCas(m.addr, m.pin, joinDialers[0]!);
    identities.length = 0;
    await pool(m.names, m.concurrency, async (nodename, w) => {
      const keys = generateKeyPair();
      const bundle = await new ApiClient({ address: m.addr, dialer: joinDialers[w]!, ca: cas.host_ca }).call<CertBundle & { hostId: string }>('POST', '/webapi/join', {
        token: m.token,
        roles: ['app'],
        nodename,
        public_addrs: [],
        public_key: keys.publicKeyPem,
        ssh_public_key: keys.sshPublicKey,
      });
      identities.push({
        hostId: bundle.hostId,
        cluster: bundle.clusterName,
        roles: ['app'],
        nodename,
        server: m.addr,
        joinedVia: 'proxy',
        key: keys.privateKeyPem,
        cert: bundle.tlsCert,
        sshCert: bundle.sshCert,
        hostCa: bundle.hostCaPem,
        userCa: bundle.userCaPem,
        sshUserCa: bundle.sshUserCa,
        identity: identityFromCert(bundle.tlsCert),
      });
    });
  };
  const connect = async (m: Extract<ToChild, { op: 'connect' }>) => {
    const from = agents.length;
    const batch = identities.slice(from, from + m.count).map((identity, i) => {
      const source = `${sourceBase}.${1 + Math.floor((from + i) / AGENTS_PER_SOURCE)}`;
      return new TunnelAgent({
        identity,
        dialer: new SourceDialer(source),
        services: ['app'],
        resources: { databases: [], apps: [{ name: `app-${identity.nodename}`, kind: 'tcp', labels: {} }], desktops: [], kube_clusters: [] },
        connectResource: () => Promise.reject(new Error('idle agent')),
      });
    });
    agents.push(...batch);
    await pool(batch, m.concurrency, (a) => {
      const connected = new Promise<void>((r) => a.once('connected', () => r()));
      a.start();
      return withTimeout('an idle agent connecting', connected, 120_000);
    });
  };
  process.on('message', (m: ToChild) => {
    const t0 = Date.now();
    const work = m.op === 'join' ? join(m) : m.op === 'connect' ? connect(m) : Promise.resolve();
    work.then(
      () => send(status(t0)),
      (err: unknown) => send({ op: 'error', message: (err as Error).stack ?? String(err) }),
    );
  });
  process.once('disconnect', () => {
    for (const a of agents) a.stop();
    setTimeout(() => process.exit(0), 200).unref();
  });
}

// Run as a child only (bench/tunnel/idle.ts): the entry point waits for requests. The agents log errors only
// (thousands of "reverse tunnel ready" and "closed" lines otherwise).
if (process.send) {
  setRootLogger(createLogger({ level: 'error' }));
  await idleAgentsChild();
}
