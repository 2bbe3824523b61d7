/**
 * Readiness on a schedule (src/net/health.ts) and the checks of each role (src/roles/health.ts): /readyz reads the
 * last round and runs nothing, so a flood of probes never reaches what is checked; a check that hangs fails at its
 * deadline and never stacks rounds; a failure and a recovery are each seen by the next round; the diagnostics
 * listener is refused on a public listener's address. No timing is asserted: rounds are driven by hand.
 */
import { describe, expect, it } from 'vitest';
import { parseConfig } from '../../src/config/index.js';
import { HealthMonitor } from '../../src/net/health.js';
import net from 'node:net';
import { checkDiagAddr, reachTcp, readinessChecks } from '../../src/roles/health.js';
import { codeOf } from '../helpers/errors.js';

describe('HealthMonitor', () => {
  it('answers from the last round: a flood of reports runs no check', async () => {
    let runs = 0;
    const m = new HealthMonitor([{ name: 'backend', run: async () => void runs++ }], { intervalMs: 60_000 });
    expect(m.report()).toMatchObject({ status: 'not ready', checks: [{ name: 'backend', ok: false, detail: 'not checked yet' }] });
    await m.runRound();
    for (let i = 0; i < 10_000; i++) m.report();
    await new Promise((r) => setImmediate(r)); // a check a report started would have run by now
    expect(runs).toBe(1);
    expect(m.report()).toMatchObject({ status: 'ready', checks: [{ name: 'backend', ok: true }] });
  });

  it('a failure is named with its reason, and its since is when it started failing; the recovery is seen by the next round', async () => {
    let fail = false;
    let t = Date.parse('2026-01-01T00:00:00Z');
    const m = new HealthMonitor([{ name: 'db pg', run: async () => { if (fail) throw new Error('ECONNREFUSED'); return 'connected'; } }], { intervalMs: 60_000, now: () => new Date(t) });
    await m.runRound();
    fail = true;
    t += 1000;
    await m.runRound();
    t += 1000;
    await m.runRound();
    expect(m.report()).toEqual({ status: 'not ready', checks: [{ name: 'db pg', ok: false, detail: 'ECONNREFUSED', since: '2026-01-01T00:00:01.000Z' }] });
    fail = false;
    t += 1000;
    await m.runRound();
    expect(m.report()).toEqual({ status: 'ready', checks: [{ name: 'db pg', ok: true, detail: 'connected', since: '2026-01-01T00:00:03.000Z' }] });
  });

  it('hostile: a check that never answers fails at its deadline, rounds never overlap, and a long detail is cut', async () => {
    let started = 0;
    const m = new HealthMonitor(
      [
        { name: 'auth', run: () => { started++; return new Promise<void>(() => undefined); } },
        { name: 'noisy', run: async () => { throw new Error('x'.repeat(100_000)); } },
      ],
      { intervalMs: 200, timeoutMs: 50 },
    );
    const first = m.runRound();
    void m.runRound(); // while the first runs: the same round, not a second one
    await first;
    expect(started).toBe(1);
    const [auth, noisy] = m.report().checks;
    expect(auth).toMatchObject({ ok: false, detail: 'no answer within 50 ms' });
    expect(noisy!.detail.length).toBeLessThan(400);
  });
});

describe('readiness checks of the roles', () => {
  it('a Proxy: one check per listener, failing when it stops listening; an agent: its tunnel', async () => {
    const listening = [{ name: 'web', address: '127.0.0.1:3080', listening: true }];
    const tunnel = { state: 'connected', getState() { return this.state; }, links: () => ['p1'] };
    const m = new HealthMonitor(readinessChecks({ timeoutMs: 100, listeners: () => listening, tunnel }), { intervalMs: 60_000 });
    await m.runRound();
    expect(m.report().status).toBe('ready');
    listening[0]!.listening = false;
    tunnel.state = 'reconnecting';
    await m.runRound();
    expect(m.report().checks.map((c) => [c.name, c.ok])).toEqual([['listener web', false], ['tunnel', false]]);
  });
});

describe('a direct-join agent\'s SSH listener check (a TCP connect, closed at once)', () => {
  it('passes while the listener accepts, fails naming the address once it is gone', async () => {
    const server = net.createServer((s) => s.destroy());
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    const addr = `127.0.0.1:${(server.address() as net.AddressInfo).port}`;
    const m = new HealthMonitor(readinessChecks({ timeoutMs: 1_000, sshListener: { check: (ms) => reachTcp(addr, ms) } }), { intervalMs: 60_000 });
    await m.runRound();
    expect(m.report().checks[0]).toMatchObject({ name: 'ssh listener', ok: true });
    await new Promise((r) => server.close(r));
    await m.runRound();
    expect(m.report().checks[0]).toMatchObject({ name: 'ssh listener', ok: false, detail: `${addr}: ECONNREFUSED` });
  });
});

describe('--diag-addr / gateway.diag_addr', () => {
  const config = (diag: string) => parseConfig(['gateway:', `  diag_addr: ${diag}`, 'auth_service:', '  listen_addr: 127.0.0.1:3025', 'proxy_service:', '  web_listen_addr: 0.0.0.0:3080', ''].join('\n'), 'test');
  it('is refused on the address of a public listener (the same port, either on every interface): never on the public port', async () => {
    expect(await codeOf(async () => checkDiagAddr(config('127.0.0.1:3080'), ['auth_service', 'proxy_service']))).toBe('GW_ERR_DIAG_ADDR_PUBLIC');
    expect(await codeOf(async () => checkDiagAddr(config('127.0.0.1:3025'), ['auth_service', 'proxy_service']))).toBe('GW_ERR_DIAG_ADDR_PUBLIC');
  });
  it('is taken on a port of its own, or the same port on another host than a listener bound to one address', () => {
    expect(() => checkDiagAddr(config('127.0.0.1:3000'), ['auth_service', 'proxy_service'])).not.toThrow();
    expect(() => checkDiagAddr(config('127.0.0.2:3025'), ['auth_service', 'proxy_service'])).not.toThrow();
  });
});
