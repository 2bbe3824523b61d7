/**
 * The managed rollout end to end (docs/upgrades.md, "Managed rollouts"), with a real Auth Service and Proxy
 * (`gateway start`) and three real agents joined with a token, whose hello carries their version and no group
 * (so the catch-all group holds them): the Proxy's public instruction endpoint with no resources (the seed's
 * channels) and with them, `gwctl autoupdate status`, a canary's unhealthy health report halting its group (the
 * report written into its presence through the backend file, as its Proxy would: the agents' health messages are
 * their own part's), the halt in the audit log, suspend and resume, an emergency rollback, a flood of upgraders on
 * the public endpoint, and hostile queries.
 */
import https from 'node:https';
import { join } from 'node:path';
import getPort from 'get-port';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { openSqliteBackend } from '../../src/backend/index.js';
import type { Presence } from '../../src/auth/records.js';
import type { AgentInstruction, RolloutStatus } from '../../src/wire/autoupdate.js';
import { runCli, startGateway, type RunningGateway } from '../helpers/gateway.js';
import { eventually } from '../helpers/wait.js';

/** fn's first defined result (polled: no timing asserted). */
const waitFor = <T>(fn: () => Promise<T | undefined>, what: string): Promise<T> =>
  eventually(what, async () => {
    const v = await fn();
    if (v === undefined) throw new Error('not yet');
    return v;
  });

let cluster: RunningGateway;
const agents: RunningGateway[] = [];
let proxyAddr: string;
const gwctl = (args: string[], input?: string) => runCli('gwctl', ['--data-dir', cluster.dataDir, ...args], input === undefined ? {} : { input });

/** GET on the Proxy's public port, no client certificate (the cluster's CA is self-signed: not checked here). */
function get(path: string): Promise<{ status: number; body: Record<string, unknown> }> {
  return new Promise((resolve, reject) => {
    const [host, port] = proxyAddr.split(':');
    https
      .get({ host, port: Number(port), path, rejectUnauthorized: false, timeout: 10_000 }, (res) => {
        let text = '';
        res.on('data', (c: Buffer) => (text += c.toString()));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body: JSON.parse(text || '{}') as Record<string, unknown> }));
      })
      .on('error', reject);
  });
}

const instruction = async (hostId: string): Promise<AgentInstruction> => {
  const r = await get(`/v1/webapi/autoupdate/agent?host_id=${hostId}`);
  expect(r.status, JSON.stringify(r.body)).toBe(200);
  return r.body as unknown as AgentInstruction;
};

async function status(): Promise<RolloutStatus> {
  const r = await gwctl(['autoupdate', 'status', '-f', 'json']);
  expect(r.status, r.stderr).toBe(0);
  return JSON.parse(r.stdout) as RolloutStatus;
}

beforeAll(async () => {
  proxyAddr = `127.0.0.1:${await getPort({ host: '127.0.0.1' })}`;
  cluster = await startGateway(
    ['gateway:', '  nodename: proxy-1', '  data_dir: DATA_DIR', '  log: { format: json }', 'auth_service:', '  cluster_name: rollout.example', '  listen_addr: 127.0.0.1:0', '  autoupdate_interval: 200ms', 'proxy_service:', `  web_listen_addr: ${proxyAddr}`, `  public_addr: ${proxyAddr}`, ''].join('\n'),
  );
  const created = JSON.parse((await gwctl(['tokens', 'add', '--type=node', '--uses=0', '-f', 'json'])).stdout) as { token: string; ca_pin: string };
  for (const n of [1, 2, 3]) {
    const agent = await startGateway(['gateway:', `  nodename: node-${n}`, '  data_dir: DATA_DIR', '  log: { format: json }', 'ssh_service:', '  enabled: yes', ''].join('\n'), {
      args: ['--token', created.token, '--ca-pin', created.ca_pin, '--proxy', proxyAddr],
    });
    agents.push(agent);
    await agent.waitForLog('reverse tunnel ready');
  }
}, 120_000);

afterAll(async () => {
  for (const a of agents) await a.stop();
  await cluster?.stop();
}, 60_000);

describe('a managed rollout on a real cluster', () => {
  it('no resources: the Proxy answers managed false (the channels apply)', async () => {
    expect(await instruction(agents[0]!.hostId!)).toMatchObject({ managed: false, update: false });
  });

  it('hostile queries are refused with their code, and a flood of upgraders is answered', async () => {
    for (const q of ['', 'host_id=nope', `host_id=${agents[0]!.hostId}&group=Bad_Group`, `host_id=${agents[0]!.hostId}&group=${'a'.repeat(400)}`, `host_id=${agents[0]!.hostId}&host_id=${agents[1]!.hostId}`]) {
      const r = await get(`/v1/webapi/autoupdate/agent?${q}`);
      expect(r.status, q).toBe(400);
      expect((r.body.error as { code: string }).code).toBe('GW_ERR_AUTOUPDATE_QUERY');
    }
    const flood = await Promise.all(Array.from({ length: 200 }, () => get(`/v1/webapi/autoupdate/agent?host_id=${agents[1]!.hostId}`)));
    expect(flood.every((r) => r.status === 200)).toBe(true);
  });

  it('with a target: canaries first; an unhealthy canary halts its group and is told to go back', async () => {
    const manifest = [
      'kind: autoupdate_config',
      'spec: { agents: { canary_healthy_for: 10s, canary_deadline: 10m, schedules: { regular: [ { name: fleet, canary_count: 1 } ] } } }',
      '---',
      'kind: autoupdate_version',
      'spec: { agents: { start_version: 17.0.0-dev, target_version: 17.0.1, schedule: immediate } }',
      '',
    ].join('\n');
    const created = await gwctl(['create', '-'], manifest);
    expect(created.status, created.stderr).toBe(0);
    const s = await waitFor(async () => {
      const now = await status();
      return now.groups[0]?.state === 'canary' ? now : undefined;
    }, 'the group starts with its canary');
    const canary = s.groups[0]!.canaries[0]!;
    expect(s.groups[0]!.versions).toEqual({ '17.0.0-dev': 3 });
    // Answers asked before the resources existed are kept a second or two by the Proxy (the flood above): poll.
    const managed = (hostId: string) => waitFor(async () => {
      const i = await instruction(hostId);
      return i.managed ? i : undefined;
    }, 'the Proxy answers with the rollout');
    expect(await managed(canary.host_id)).toMatchObject({ managed: true, update: true, canary: true, version: '17.0.1', group: 'fleet' });
    const other = agents.map((a) => a.hostId!).find((h) => h !== canary.host_id)!;
    expect(await managed(other)).toMatchObject({ managed: true, update: false, version: '17.0.0-dev' });

    // The canary comes back on the target and reports a failed check: its Proxy writes that into its presence.
    const backend = openSqliteBackend({ path: join(cluster.dataDir, 'backend.sqlite'), sweepIntervalMs: 0 });
    try {
      const [item] = await backend.range(`/presence/${canary.host_id}/`);
      const p = JSON.parse(item!.value) as Presence;
      const at = new Date().toISOString();
      const bad: Presence = { ...p, version: '17.0.1', connectedAt: at, lastHeartbeat: at, health: { ok: false, checks: [{ name: 'resources', ok: false, detail: 'sshd does not answer' }], measured_at: new Date(Date.now() + 1).toISOString() } };
      await backend.put(item!.key, JSON.stringify(bad), { ttlMs: 600_000 });
    } finally {
      await backend.close();
    }
    const halted = await waitFor(async () => {
      const now = await status();
      return now.groups[0]?.state === 'halted' ? now : undefined;
    }, 'the group halts');
    expect(halted.groups[0]!.reason).toContain('sshd does not answer');
    expect(halted.groups[0]!.reason).toContain(canary.host_id);
    // The Proxy keeps an answer a second or two (and the Auth Service its inputs a second): the halt shows after that.
    await waitFor(async () => ((await instruction(canary.host_id)).version === '17.0.0-dev' ? true : undefined), 'the canary is told to go back');
    expect(await instruction(canary.host_id)).toMatchObject({ update: true, canary: true, version: '17.0.0-dev' });
    expect(await instruction(other)).toMatchObject({ update: false });
    const events = JSON.parse((await gwctl(['get', 'events', '-f', 'json'])).stdout) as Array<{ spec: { event: string; reason?: string } }>;
    expect(events.find((e) => e.spec.event === 'autoupdate.halted')?.spec.reason).toContain('sshd does not answer');
    const text = await gwctl(['autoupdate', 'status']);
    expect(text.stdout).toContain('Group fleet: HALTED');
  });

  it('suspend and resume; rollback --now tells every agent the start version at once', async () => {
    expect((await gwctl(['autoupdate', 'suspend'])).status).toBe(0);
    await waitFor(async () => (/suspended/.test((await instruction(agents[2]!.hostId!)).reason) ? true : undefined), 'the agents are told the rollout is suspended');
    expect((await gwctl(['autoupdate', 'resume'])).status).toBe(0);
    const r = await gwctl(['autoupdate', 'rollback', '--now', '-f', 'json']);
    expect(r.status, r.stderr).toBe(0);
    expect((JSON.parse(r.stdout) as RolloutStatus).rollback).toMatchObject({ now: true });
    await waitFor(async () => {
      const all = await Promise.all(agents.map((a) => get(`/v1/webapi/autoupdate/agent?host_id=${a.hostId}`)));
      return all.every((x) => x.body.update === true && x.body.version === '17.0.0-dev') ? true : undefined;
    }, 'every agent is told the start version');
    const bad = await gwctl(['autoupdate', 'start', '--group', 'nope']);
    expect(bad.status).toBe(1);
    expect(bad.stderr).toContain('code: GW_ERR_AUTOUPDATE_GROUP');
    const rm = await gwctl(['rm', 'autoupdate_agent_rollout/autoupdate-agent-rollout']);
    expect(rm.stderr).toContain('code: GW_ERR_AUTOUPDATE_READ_ONLY');
  });
});
