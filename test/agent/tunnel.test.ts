/**
 * The agent's end of the reverse tunnel (src/agent/tunnel.ts) against a fake Proxy in this process
 * (./fakeproxy.ts): the test plays the Proxy's side of the control protocol line by line.
 */
import { once } from 'node:events';
import net from 'node:net';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { TunnelAgent, TUNNEL_RETRY, type TunnelAgentOptions } from '../../src/agent/tunnel.js';
import { Dialer } from '../../src/dial/dialer.js';
import { GatewayError } from '../../src/errors.js';
import { createLogger, setRootLogger } from '../../src/log.js';
import { readJsonLine } from '../../src/stream/lines.js';
import { CONTROL_MAX_LINE_BYTES, type ControlMessage, type DialAnswer, type DialRequest, type HelloMessage } from '../../src/tunnel/protocol.js';
import { ManualClock } from '../helpers/clock.js';
import { makeTestPki, type TestPki } from '../helpers/tls.js';
import { FakeProxy, fakeIdentity } from './fakeproxy.js';

setRootLogger(createLogger({ level: 'silent' }));

let pki: TestPki;
let proxy: FakeProxy;
let echo: net.Server;
let agentCert: { certPem: string; keyPem: string };

beforeAll(async () => {
  pki = await makeTestPki();
  agentCert = await pki.serverCert({ names: ['node-1'], ips: [] });
  echo = net.createServer((s) => s.on('error', () => undefined).pipe(s)); // a relay that breaks resets it (an RST, not a FIN)
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

async function startAgent(extra: Partial<TunnelAgentOptions> = {}): Promise<{ agent: TunnelAgent; events: string[] }> {
  proxy = new FakeProxy();
  await proxy.start(pki);
  const identity = fakeIdentity(agentCert, proxy.webAddr, proxy.hostCa);
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
    ...extra,
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
    // A window long enough that a loaded machine's late beat does not drop the tunnel (that case is the next test).
    s.send({ ...WELCOME, heartbeatIntervalMs: 20, heartbeatCountMax: 1000 });
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

  it('retries after TUNNEL_RETRY on the injected clock: doubling while it fails, even through a welcome the Proxy drops at once; from the first delay again after a tunnel that stayed up resetAfterMs', async () => {
    const clock = new ManualClock();
    const { agent } = await startAgent({ backoff: TUNNEL_RETRY, backoffDeps: clock.deps(() => 0) });
    const dropBy = async (n: number, welcome: boolean, upForMs = 0) => {
      const s = await proxy.session(n);
      await s.next('hello');
      if (welcome) {
        const connected = until(agent, 'connected');
        s.send(WELCOME);
        await connected;
        clock.advance(upForMs); // no timer is pending while the tunnel is up: this only moves the clock
      }
      const down = once(agent, 'state');
      s.channel.write(Buffer.alloc(CONTROL_MAX_LINE_BYTES + 1, 0x20));
      await down; // 'waiting': the retry is scheduled
      expect(clock.pending).toBe(1);
      clock.fireNext();
    };
    await dropBy(0, false);
    await dropBy(1, false);
    await dropBy(2, true); // welcomed, then dropped at once: no fast retry earned
    await dropBy(3, true, TUNNEL_RETRY.resetAfterMs!); // up long enough: the sequence starts again
    await (await proxy.session(4)).next('hello');
    // random 0: the low end of equal jitter, half of each ceiling (500, 1000, 2000; then 500 again).
    expect(TUNNEL_RETRY.resetAfterMs).toBeGreaterThan(0);
    expect(clock.delays).toEqual([250, 500, 1000, 250]);
  });

  it('serves forwarded connections: the dial answer, then the resource’s bytes; or the error of a resource it cannot reach', async () => {
    const { agent } = await startAgent();
    const s = await proxy.session(0);
    const connected = until(agent, 'connected');
    s.send(WELCOME);
    await connected;
    const request: DialRequest = { service: 'app', resource: 'pg', client_src: '127.0.0.1:50000', client_dst: '127.0.0.1:443' };
    const ok = await proxy.forward(s, request);
    expect(await readJsonLine<DialAnswer>(ok)).toEqual({ ok: true });
    ok.write('ping');
    const [echoed] = (await once(ok, 'data')) as [Buffer];
    expect(echoed.toString()).toBe('ping');
    ok.destroy();
    const refused = await proxy.forward(s, { ...request, resource: 'nope' });
    expect(await readJsonLine<DialAnswer>(refused)).toEqual({ ok: false, error: { code: 'GW_ERR_TUNNEL_NOT_FOUND', message: 'this agent serves no db "nope"' } });
  });

  it('hostile Proxy-side dials of a database: the startup is checked against db_access, and a dial without it is refused', async () => {
    const { agent } = await startAgent();
    const s = await proxy.session(0);
    const connected = until(agent, 'connected');
    s.send(WELCOME);
    await connected;
    const startup = (user: string) => {
      const body = Buffer.from(`user\0${user}\0database\0shop\0\0`);
      const head = Buffer.alloc(8);
      head.writeUInt32BE(body.length + 8, 0);
      head.writeUInt32BE(0x00030000, 4);
      return Buffer.concat([head, body]);
    };
    const grant = { users: { allow: ['alice'], deny: [] }, names: { allow: ['shop'], deny: [] } };
    const request: DialRequest = { service: 'db', resource: 'pg', client_src: '127.0.0.1:50000', client_dst: '127.0.0.1:443', user: 'alice', db_access: grant };
    // Allowed: the startup reaches the database (the echo server sends it back).
    const ok = await proxy.forward(s, request);
    expect(await readJsonLine<DialAnswer>(ok)).toEqual({ ok: true });
    ok.write(startup('alice'));
    const [echoed] = (await once(ok, 'data')) as [Buffer];
    expect(echoed).toEqual(startup('alice'));
    ok.destroy();
    // Another database user, or no decision at all (a Proxy of an older version, a forged dial): a FATAL with the code.
    for (const r of [request, { ...request, db_access: undefined }]) {
      const denied = await proxy.forward(s, r);
      expect(await readJsonLine<DialAnswer>(denied)).toEqual({ ok: true });
      denied.write(startup('postgres'));
      const chunks: Buffer[] = [];
      denied.on('data', (c: Buffer) => chunks.push(c));
      await once(denied, 'end');
      const text = Buffer.concat(chunks).toString('latin1');
      expect(text.startsWith('E')).toBe(true);
      expect(text).toContain('C28000');
      expect(text).toContain('GW_ERR_DB_USER_DENIED');
      expect(text).not.toContain('user\0postgres'); // not the echo of the startup: the database never saw it
    }
  });
});
