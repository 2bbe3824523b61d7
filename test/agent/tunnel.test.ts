/**
 * The agent's end of the reverse tunnel (src/agent/tunnel.ts) against a fake Proxy in this process: an HTTPS
 * server that answers /webapi/find and a plain ssh2 server that accepts the agent and hands each control channel
 * to the test, which plays the Proxy's side of the control protocol line by line.
 */
import { EventEmitter, once } from 'node:events';
import https from 'node:https';
import net from 'node:net';
import type { Duplex } from 'node:stream';
import ssh2 from 'ssh2';
import type { Connection, ServerChannel } from 'ssh2';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { HostIdentity } from '../../src/agent/identity.js';
import { TunnelAgent } from '../../src/agent/tunnel.js';
import { generateKeyPair, sshPrivateKeyPem } from '../../src/auth/pki.js';
import { Dialer } from '../../src/dial/dialer.js';
import { GatewayError } from '../../src/errors.js';
import { createLogger, setRootLogger } from '../../src/log.js';
import { readJsonLine, writeJsonLine } from '../../src/stream/lines.js';
import { ControlDecoder } from '../../src/tunnel/control.js';
import { CONTROL_MAX_LINE_BYTES, CONTROL_SUBSYSTEM, TUNNEL_BIND, type ControlMessage, type DialAnswer, type DialRequest, type HelloMessage } from '../../src/tunnel/protocol.js';
import { makeTestPki, type TestPki } from '../helpers/tls.js';

setRootLogger(createLogger({ level: 'silent' }));

/** One control channel the agent opened: what it sent so far, and a way to wait for more. */
class ControlSession extends EventEmitter {
  readonly received: ControlMessage[] = [];
  closed = false;

  constructor(
    readonly conn: Connection,
    readonly channel: ServerChannel,
  ) {
    super();
    const decoder = new ControlDecoder();
    channel.on('data', (chunk: Buffer) => {
      for (const m of decoder.push(chunk)) {
        this.received.push(m);
        this.emit('message', m);
      }
    });
    conn.once('close', () => {
      this.closed = true;
      this.emit('gone');
    });
  }

  send(m: ControlMessage | Record<string, unknown>): void {
    writeJsonLine(this.channel, m);
  }

  /** The first message (already received or still to come) that matches. */
  async next<T extends ControlMessage['type']>(type: T, pred: (m: Extract<ControlMessage, { type: T }>) => boolean = () => true): Promise<Extract<ControlMessage, { type: T }>> {
    const match = (m: ControlMessage): m is Extract<ControlMessage, { type: T }> => m.type === type && pred(m as Extract<ControlMessage, { type: T }>);
    const found = this.received.find(match);
    if (found) return found;
    return new Promise((resolve) => {
      const on = (m: ControlMessage) => {
        if (!match(m)) return;
        this.off('message', on);
        resolve(m);
      };
      this.on('message', on);
    });
  }

  async gone(): Promise<void> {
    if (!this.closed) await once(this, 'gone');
  }
}

class FakeProxy {
  readonly sessions: ControlSession[] = [];
  private readonly arrivals = new EventEmitter();
  private ssh!: ssh2.Server;
  private web!: https.Server;
  readonly hostKey = generateKeyPair();
  webAddr = '';

  async start(pki: TestPki): Promise<void> {
    this.ssh = new ssh2.Server({ hostKeys: [sshPrivateKeyPem(this.hostKey.privateKeyPem)] }, (conn) => this.onConnection(conn));
    await new Promise<void>((resolve) => this.ssh.listen(0, '127.0.0.1', resolve));
    const tunnelAddr = `127.0.0.1:${(this.ssh.address() as net.AddressInfo).port}`;
    const cert = await pki.serverCert({ names: [], ips: ['127.0.0.1'] });
    const find = { proxy: { tls_routing_enabled: false, ssh: { ssh_tunnel_public_addr: tunnelAddr } }, cluster_name: 'test', tunnel_host_keys: [this.hostKey.sshPublicKey] };
    this.web = https.createServer({ cert: cert.certPem, key: cert.keyPem }, (req, res) => {
      res.writeHead(req.url === '/webapi/find' ? 200 : 404, { 'content-type': 'application/json' });
      res.end(JSON.stringify(req.url === '/webapi/find' ? find : { error: { code: 'GW_ERR_API_NOT_FOUND', message: 'no' } }));
    });
    await new Promise<void>((resolve) => this.web.listen(0, '127.0.0.1', resolve));
    this.webAddr = `127.0.0.1:${(this.web.address() as net.AddressInfo).port}`;
  }

  private onConnection(conn: Connection): void {
    conn.on('error', () => undefined);
    conn.on('authentication', (ctx) => (ctx.method === 'publickey' && ctx.username === 'host-1' ? ctx.accept() : ctx.reject(['publickey'])));
    conn.on('request', (accept, reject, name) => (name === 'tcpip-forward' ? accept?.() : reject?.()));
    conn.on('ready', () => {
      conn.on('session', (acceptSession) => {
        acceptSession().on('subsystem', (acceptSub, rejectSub, info) => {
          if (info.name !== CONTROL_SUBSYSTEM) return rejectSub?.();
          const session = new ControlSession(conn, acceptSub());
          this.sessions.push(session);
          this.arrivals.emit('session', session);
        });
      });
    });
  }

  /** Control session number n (0-based), now or when the agent opens it. */
  async session(n: number): Promise<ControlSession> {
    while (this.sessions.length <= n) await once(this.arrivals, 'session');
    return this.sessions[n]!;
  }

  /** A forwarded connection to the agent, as the Proxy opens one for a client. */
  forward(session: ControlSession, request: DialRequest): Promise<Duplex> {
    return new Promise((resolve, reject) =>
      session.conn.forwardOut(TUNNEL_BIND.addr, TUNNEL_BIND.port, '127.0.0.1', 50000, (err, channel) => {
        if (err) return reject(err);
        writeJsonLine(channel, request);
        resolve(channel);
      }),
    );
  }

  async stop(): Promise<void> {
    for (const s of this.sessions) s.conn.end();
    this.ssh.close();
    this.web.closeAllConnections();
    await new Promise((resolve) => this.web.close(resolve));
  }
}

let pki: TestPki;
let proxy: FakeProxy;
let echo: net.Server;
let agentCert: { certPem: string; keyPem: string };

beforeAll(async () => {
  pki = await makeTestPki();
  agentCert = await pki.serverCert({ names: ['node-1'], ips: [] });
  echo = net.createServer((s) => s.pipe(s));
  await new Promise<void>((resolve) => echo.listen(0, '127.0.0.1', resolve));
});

afterAll(async () => {
  echo.close();
  await pki.cleanup();
});

const agents: TunnelAgent[] = [];
afterEach(async () => {
  for (const a of agents.splice(0)) a.stop();
  await proxy.stop();
});

const WELCOME = { type: 'welcome', proxyId: 'proxy-1', heartbeatIntervalMs: 60_000, heartbeatCountMax: 3 } as const;

async function startAgent(): Promise<{ agent: TunnelAgent; events: string[] }> {
  proxy = new FakeProxy();
  await proxy.start(pki);
  const identity = {
    hostId: 'host-1',
    cluster: 'test',
    roles: ['db'],
    nodename: 'node-1',
    server: proxy.webAddr,
    joinedVia: 'proxy',
    key: agentCert.keyPem,
    cert: agentCert.certPem,
    sshCert: '',
    hostCa: pki.caPem,
    userCa: '',
    sshUserCa: '',
    identity: { kind: 'host', name: 'host-1', cluster: 'test', roles: ['db'] },
  } satisfies HostIdentity;
  const agent = new TunnelAgent({
    identity,
    dialer: new Dialer({ env: {} }),
    services: ['db'],
    resources: { databases: [{ name: 'pg', protocol: 'postgres', labels: {} }], apps: [], desktops: [], kube_clusters: [] },
    connectResource: async (request) => {
      if (request.resource !== 'pg') throw new GatewayError('GW_ERR_TUNNEL_NOT_FOUND', `this agent serves no db "${request.resource}"`);
      return net.connect((echo.address() as net.AddressInfo).port, '127.0.0.1');
    },
    backoff: { firstMs: 5, maxMs: 20 },
  });
  agents.push(agent);
  const events: string[] = [];
  agent.on('maintenance-changed', () => events.push('maintenance-changed'));
  agent.on('connected', (id: string) => events.push(`connected ${id}`));
  agent.on('discovery', (proxies: Array<{ id: string }>) => events.push(`discovery ${proxies.map((p) => p.id).join(',')}`));
  agent.on('disconnected', (reason: string) => events.push(`disconnected ${reason}`));
  agent.start();
  return { agent, events };
}

async function until(agent: TunnelAgent, event: string): Promise<unknown[]> {
  return once(agent, event);
}

describe('TunnelAgent', () => {
  it('says hello; on the welcome it is connected, reports a possible maintenance change and sends the events it queued', async () => {
    const { agent, events } = await startAgent();
    agent.sendEvent({ event: 'queued while down' }); // not connected yet: queued
    const s = await proxy.session(0);
    const hello = (await s.next('hello')) as HelloMessage;
    expect(hello).toMatchObject({ version: 1, hostId: 'host-1', nodename: 'node-1', services: ['db'] });
    expect(hello.resources.databases).toEqual([{ name: 'pg', protocol: 'postgres', labels: {} }]);
    expect(agent.getState()).toBe('connecting');
    const connected = until(agent, 'connected');
    s.send(WELCOME);
    expect(await connected).toEqual(['proxy-1']);
    expect(events).toEqual(['maintenance-changed', 'connected proxy-1']);
    expect(agent.getState()).toBe('connected');
    expect((await s.next('event')).event).toEqual({ event: 'queued while down' });
  });

  it('turns discovery and maintenance-changed into events, and ignores lines it does not know or that are malformed', async () => {
    const { agent, events } = await startAgent();
    const s = await proxy.session(0);
    const connected = until(agent, 'connected');
    s.send(WELCOME);
    await connected;
    s.channel.write('not json\n');
    s.send({ type: 'from-a-newer-proxy', x: 1 });
    s.send({ type: 'welcome', proxyId: 'bogus' }); // no intervals: ignored, not a second welcome
    s.send({ type: 'discovery', proxies: [{ id: 'proxy-1', addr: 'a:443' }, { id: 'proxy-2', addr: 'b:443' }] });
    const changed = until(agent, 'maintenance-changed');
    s.send({ type: 'maintenance-changed' });
    await changed;
    expect(events).toEqual(['maintenance-changed', 'connected proxy-1', 'discovery proxy-1,proxy-2', 'maintenance-changed']);
    expect(agent.getState()).toBe('connected');
  });

  it('heartbeats at the interval the welcome sets, with a rising sequence', async () => {
    const { agent } = await startAgent();
    const s = await proxy.session(0);
    s.on('message', (m: ControlMessage) => m.type === 'heartbeat' && s.send({ type: 'heartbeat', seq: m.seq })); // the Proxy's own
    const connected = until(agent, 'connected');
    s.send({ ...WELCOME, heartbeatIntervalMs: 20 });
    await connected;
    await s.next('heartbeat', (m) => m.seq === 3);
    const seqs = s.received.filter((m) => m.type === 'heartbeat').map((m) => (m as { seq: number }).seq);
    expect(seqs.slice(0, 3)).toEqual([1, 2, 3]);
    expect(agent.getState()).toBe('connected');
  });

  it('drops the tunnel when the Proxy goes silent for its whole heartbeat window, and connects again', async () => {
    const { agent, events } = await startAgent();
    const first = await proxy.session(0);
    first.send({ ...WELCOME, heartbeatIntervalMs: 20, heartbeatCountMax: 1 });
    await until(agent, 'disconnected');
    await first.gone();
    const second = await proxy.session(1);
    expect((await second.next('hello')).hostId).toBe('host-1');
    expect(events.filter((e) => e.startsWith('disconnected'))).toHaveLength(1);
  });

  it('on a reconnect notice: reports it, closes the connection and connects again at once', async () => {
    const { agent } = await startAgent();
    const first = await proxy.session(0);
    const connected = until(agent, 'connected');
    first.send(WELCOME);
    await connected;
    const disconnected = until(agent, 'disconnected');
    first.send({ type: 'reconnect', reason: 'proxy shutting down' });
    expect(await disconnected).toEqual(['reconnect notice']);
    await first.gone();
    const second = await proxy.session(1);
    await second.next('hello');
    const again = until(agent, 'connected');
    second.send({ ...WELCOME, proxyId: 'proxy-2' });
    expect(await again).toEqual(['proxy-2']);
  });

  it('drops the tunnel on a control line longer than the cap, then connects again', async () => {
    const { agent } = await startAgent();
    const first = await proxy.session(0);
    const connected = until(agent, 'connected');
    first.send(WELCOME);
    await connected;
    const disconnected = until(agent, 'disconnected');
    first.channel.write(Buffer.alloc(CONTROL_MAX_LINE_BYTES + 1, 0x20));
    await disconnected;
    await first.gone();
    await (await proxy.session(1)).next('hello');
  });

  it('serves forwarded connections: the dial answer, then the resource’s bytes; or the error of a resource it cannot reach', async () => {
    const { agent } = await startAgent();
    const s = await proxy.session(0);
    const connected = until(agent, 'connected');
    s.send(WELCOME);
    await connected;
    const request: DialRequest = { service: 'db', resource: 'pg', client_src: '127.0.0.1:50000', client_dst: '127.0.0.1:443' };
    const ok = await proxy.forward(s, request);
    expect(await readJsonLine<DialAnswer>(ok)).toEqual({ ok: true });
    ok.write('ping');
    const [echoed] = (await once(ok, 'data')) as [Buffer];
    expect(echoed.toString()).toBe('ping');
    ok.destroy();
    const refused = await proxy.forward(s, { ...request, resource: 'nope' });
    expect(await readJsonLine<DialAnswer>(refused)).toEqual({ ok: false, error: { code: 'GW_ERR_TUNNEL_NOT_FOUND', message: 'this agent serves no db "nope"' } });
  });
});
