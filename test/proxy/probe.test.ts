/**
 * The probe at the Proxy (src/proxy/probe.ts) against routers that behave and that lie: each hop's time from the
 * reports on the stream (local, and through a peer), no existence leak (a resource the roles do not reach is not
 * found exactly as an absent one), an agent that never answers ends at the deadline naming the hop, a report that
 * is garbage or too long is refused, a stream that arrives after the deadline is destroyed, and the gauges carry
 * only the kind and the hop. No timing is asserted: only that each hop is there and none is negative.
 */
import { PassThrough, type Duplex } from 'node:stream';
import { describe, expect, it } from 'vitest';
import type { Identity } from '../../src/auth/pki.js';
import type { Role } from '../../src/auth/rbac.js';
import type { GatewayError } from '../../src/errors.js';
import { registry } from '../../src/metrics/registry.js';
import { hopTimes, runProbe, type ProbeContext } from '../../src/proxy/probe.js';
import type { Decision } from '../../src/proxy/router.js';
import type { DialRequest } from '../../src/tunnel/protocol.js';
import { codeOf } from '../helpers/errors.js';

const agent = {
  hostId: 'h1',
  nodename: 'agent-1',
  services: ['db' as const],
  resources: { databases: [{ name: 'pg', protocol: 'postgres' as const, labels: { env: 'prod' } }, { name: 'secret', protocol: 'postgres' as const, labels: { env: 'secret' } }], apps: [], desktops: [], kube_clusters: [] },
  connectedAt: new Date(),
};
const role = (labels: Record<string, string>): Role => ({ kind: 'role', version: 'v7', metadata: { name: 'r' }, spec: { allow: { db_labels: labels } } }) as Role;
const alice: Identity = { kind: 'user', name: 'alice', roles: ['r'], cluster: 'c' } as Identity;

/** A stream that carries these lines and ends, as an agent (and a peer) writes them. */
function answered(...lines: string[]): Duplex {
  const s = new PassThrough();
  s.end(lines.map((l) => `${l}\n`).join(''));
  return s;
}

function context(dial: (req: DialRequest) => Promise<Duplex>, via: Decision['via'] = 'local', deadlineMs = 2_000): ProbeContext & { asked: DialRequest[] } {
  const asked: DialRequest[] = [];
  return {
    asked,
    deadlineMs,
    auth: { rolesOf: async () => [role({ env: 'prod' })] },
    router: {
      agents: () => [agent],
      plan: () => [{ via, reason: 'test' } as Decision],
      dial: (_hostId: string, req: DialRequest) => {
        asked.push(req);
        return dial(req);
      },
    },
  };
}

describe('runProbe', () => {
  it('local: find, tunnel and resource, from the agent\'s report; the dial says probe and names the resource', async () => {
    const ctx = context(async () => answered('{"hop":"resource","ms":1.5}'));
    const r = await runProbe(ctx, alice, 'db', 'pg');
    expect(r).toMatchObject({ kind: 'db', resource: 'pg', agent: 'agent-1', via: 'local' });
    expect(r.hops.map((h) => h.hop)).toEqual(['find', 'tunnel', 'resource']);
    for (const h of r.hops) expect(h.ms).toBeGreaterThanOrEqual(0);
    expect(ctx.asked[0]).toMatchObject({ service: 'db', resource: 'pg', probe: true, user: 'alice' });
  });

  it('through a peer: the peer\'s own line splits its hop from the tunnel\'s', async () => {
    const r = await runProbe(context(async () => answered('{"hop":"peer-tunnel","ms":3}', '{"hop":"resource","ms":1}'), 'peer'), alice, 'db', 'pg');
    expect(r.via).toBe('peer');
    expect(r.hops.map((h) => h.hop)).toEqual(['find', 'peer', 'tunnel', 'resource']);
  });

  it('hop arithmetic: remote figures larger than the local ones that contain them are capped, never negative', () => {
    expect(hopTimes(1, 10, [{ hop: 'peer-tunnel', ms: 6 }, { hop: 'resource', ms: 2 }])).toEqual([
      { hop: 'find', ms: 1 }, { hop: 'peer', ms: 4 }, { hop: 'tunnel', ms: 4 }, { hop: 'resource', ms: 2 },
    ]);
    for (const h of hopTimes(0, 5, [{ hop: 'peer-tunnel', ms: 50 }, { hop: 'resource', ms: 90 }])) expect(h.ms).toBeGreaterThanOrEqual(0);
  });

  it('no existence leak: a resource the roles do not reach is not found, exactly as one that does not exist', async () => {
    const ctx = context(async () => answered('{"hop":"resource","ms":1}'));
    const hidden = await runProbe(ctx, alice, 'db', 'secret').catch((e: GatewayError) => e);
    const absent = await runProbe(ctx, alice, 'db', 'nosuch').catch((e: GatewayError) => e);
    expect((hidden as GatewayError).code).toBe('GW_ERR_TUNNEL_NOT_FOUND');
    expect((hidden as GatewayError).message.replace('secret', 'X')).toBe((absent as GatewayError).message.replace('nosuch', 'X'));
    expect(ctx.asked).toEqual([]); // nothing was dialled for either
  });

  it('hostile: an agent that never answers ends at the deadline, naming the tunnel hop; a late stream is destroyed', async () => {
    let late: PassThrough | undefined;
    let arrive!: () => void;
    const ctx = context(() => new Promise<Duplex>((resolve) => (arrive = () => resolve((late = new PassThrough())))), 'local', 100);
    const err = (await runProbe(ctx, alice, 'db', 'pg').catch((e: GatewayError) => e)) as GatewayError;
    expect(err.code).toBe('GW_ERR_PROBE_FAILED');
    expect(err.details.hop).toBe('tunnel');
    arrive();
    await new Promise((r) => setImmediate(r));
    expect(late!.destroyed).toBe(true);
  });

  it('hostile: through a peer that never answers, the peer hop is named', async () => {
    const err = (await runProbe(context(() => new Promise<Duplex>(() => undefined), 'peer', 100), alice, 'db', 'pg').catch((e: GatewayError) => e)) as GatewayError;
    expect(err.details.hop).toBe('peer');
  });

  it('the agent connected but the resource did not answer: the resource hop is named', async () => {
    const { GatewayError } = await import('../../src/errors.js');
    const err = (await runProbe(context(async () => { throw new GatewayError('GW_ERR_TUNNEL_DIAL_FAILED', 'ECONNREFUSED'); }), alice, 'db', 'pg').catch((e: GatewayError) => e)) as GatewayError;
    expect(err.code).toBe('GW_ERR_PROBE_FAILED');
    expect(err.details.hop).toBe('resource');
  });

  it('hostile: a report that is not one, an endless line, an agent of an earlier version (no report): refused, the stream destroyed', async () => {
    for (const stream of [() => answered('{"hop":"resource","ms":-1}'), () => answered('not json'), () => answered('x'.repeat(64 * 1024)), () => answered()]) {
      let given: Duplex | undefined;
      const code = await codeOf(runProbe(context(async () => (given = stream())), alice, 'db', 'pg'));
      expect(code).toBe('GW_ERR_PROBE_FAILED');
      expect(given!.destroyed).toBe(true);
    }
  });

  it('an unknown kind is a usage error naming the kinds', async () => {
    expect(await codeOf(runProbe(context(async () => answered()), alice, 'printer', 'pg'))).toBe('GW_ERR_USAGE');
  });

  it('the gauges: per kind and hop, never a resource name', async () => {
    await runProbe(context(async () => answered('{"hop":"resource","ms":1}')), alice, 'db', 'pg');
    const text = await registry.getSingleMetricAsString('gateway_probe_hop_seconds');
    expect(text).toMatch(/gateway_probe_hop_seconds\{kind="db",hop="resource"\} /);
    expect(text).toMatch(/hop="total"/);
    expect(text).not.toContain('pg');
    expect(await registry.getSingleMetricAsString('gateway_probe_success')).toMatch(/gateway_probe_success\{kind="db"\} 1/);
  });
});
