/**
 * `gwctl probe <kind> <name>` (docs/operations.md, "Probing the path"): a canary sent the way a user's connection
 * goes, Proxy → (peer Proxy) → tunnel → agent → resource and back, timing each hop, without a byte of the
 * resource's data: GET /v1/probe?kind=&name= on the web port, with the caller's client certificate (a user's,
 * or the local admin identity's, which may probe everything).
 *
 *   find      this Proxy looks the resource up among the agents it reaches (resources.ts) and checks the
 *             caller's roles: a resource the caller may not reach is "not found", exactly as one that does not
 *             exist (no existence leak). Who may probe is who may connect: the role's labels for that kind.
 *   peer      when the agent's tunnel is another Proxy's (router.ts decides): this Proxy's dial minus the time
 *             the peer reports for its own tunnel dial (its `peer-tunnel` line, peer.ts).
 *   tunnel    the tunnel's round trip: the dial through the agent's tunnel minus the agent's check.
 *   resource  the agent's TCP connect to the resource, closed at once (src/agent/resources.ts resourceReach).
 *
 * The dial is a DialRequest with probe: true (src/tunnel/protocol.ts): the agent answers, then writes its
 * ProbeReport line and ends. The whole probe has one deadline (PROBE_DEADLINE_MS); past it the stream is
 * destroyed and the answer names the hop that did not answer. The last result per kind and hop goes to the
 * metrics registry (src/metrics/probe.ts).
 */
import type http from 'node:http';
import type { Duplex } from 'node:stream';
import { peerIdentity } from '../auth/peeridentity.js';
import type { Identity } from '../auth/pki.js';
import { canAccess, type AccessKind } from '../auth/rbac.js';
import type { ClusterTrust, ProxyAuth } from '../auth/proxyauth.js';
import { GatewayError, toGatewayError } from '../errors.js';
import { logger } from '../log.js';
import { probeHopSeconds, probeSuccess } from '../metrics/probe.js';
import { readLine } from '../stream/lines.js';
import { PROBE_REPORT_MAX_BYTES, type ProbeReport } from '../tunnel/protocol.js';
import { findByKind } from './resources.js';
import type { Router } from './router.js';
import { sendJson, sendWebError } from './webanswer.js';

/** The kinds `gwctl probe` names, and the access kind of each. */
export const PROBE_KINDS: Readonly<Record<string, AccessKind>> = { node: 'node', db: 'db', app: 'app', kube: 'kube_cluster', desktop: 'windows_desktop' };

export type Hop = 'find' | 'peer' | 'tunnel' | 'resource';

export interface HopTime {
  hop: Hop;
  ms: number;
  detail?: string;
}

export interface ProbeResult {
  kind: string;
  resource: string;
  agent: string;
  /** How this Proxy reached the agent: local, peer, direct. */
  via: string;
  hops: HopTime[];
  total_ms: number;
}

/** The whole probe's deadline, from the request to the agent's report. */
export const PROBE_DEADLINE_MS = 10_000;

export interface ProbeContext {
  auth: Pick<ProxyAuth, 'rolesOf'>;
  router: Pick<Router, 'agents' | 'plan' | 'dial'>;
  deadlineMs?: number;
}

/** Runs one probe for `identity` (resolved as it stands now); a failure is GW_ERR_PROBE_FAILED naming its hop. */
export async function runProbe(ctx: ProbeContext, identity: Identity, kindName: string, name: string): Promise<ProbeResult> {
  const deadlineMs = ctx.deadlineMs ?? PROBE_DEADLINE_MS;
  const started = performance.now();
  const kind = PROBE_KINDS[kindName];
  if (!kind) throw new GatewayError('GW_ERR_USAGE', `probe: "${kindName.slice(0, 32)}" is not a kind of resource`, { hint: `Kinds: ${Object.keys(PROBE_KINDS).join(', ')}.` });
  const target = findByKind(ctx.router.agents(), kind, name);
  // The local admin identity may probe everything, as it may do everything else.
  const allowed = target !== undefined && (identity.kind === 'admin' || canAccess(await ctx.auth.rolesOf(identity.roles), kind, target.labels));
  if (!target || !allowed) {
    // The same answer for a resource that does not exist and one the caller's roles do not reach.
    throw new GatewayError('GW_ERR_TUNNEL_NOT_FOUND', `no ${kindName} "${name}" that you can reach is connected`, {
      hint: "List what you can reach with 'gwsh ls', 'gwsh db ls', 'gwsh apps ls' or 'gwsh kube ls'; its agent may be offline.",
    });
  }
  const find = performance.now() - started;
  const via = ctx.router.plan(target.agent.hostId)[0]!.via;
  const dialStart = performance.now();
  const result = (hops: HopTime[]): ProbeResult => ({ kind: kindName, resource: name, agent: target.agent.nodename, via, hops, total_ms: performance.now() - started });
  const failed = (hop: Hop, why: string, hops: HopTime[], code: string) => {
    record(kindName, hops, false);
    return new GatewayError('GW_ERR_PROBE_FAILED', `probe of ${kindName} "${name}" through agent "${target.agent.nodename}" failed at the ${hop} hop: ${why}`, {
      details: { hop, agentCode: code, ...result(hops) },
    });
  };
  const deadline = deadlineAfter(deadlineMs - find);
  let stream: Duplex;
  try {
    stream = await deadline.race(
      ctx.router.dial(target.agent.hostId, {
        service: target.service,
        resource: target.service === 'ssh' ? `probe@${target.agent.nodename}` : target.name,
        client_src: '0.0.0.0:0',
        client_dst: '0.0.0.0:0',
        user: identity.name,
        probe: true,
      }),
    );
  } catch (err) {
    deadline.clear();
    const e = toGatewayError(err);
    // The agent answered that the resource did not: the last hop. Else the hop towards the agent.
    const hop: Hop = e.code === 'GW_ERR_TUNNEL_DIAL_FAILED' ? 'resource' : via === 'peer' ? 'peer' : 'tunnel';
    throw failed(hop, e.message, [{ hop: 'find', ms: find }], e.code);
  }
  const dial = performance.now() - dialStart;
  try {
    const reports = await deadline.race(readReports(stream, deadlineMs));
    const hops = hopTimes(find, dial, reports);
    record(kindName, hops, true);
    logger('probe').info({ user: identity.name, kind: kindName, resource: name, agent: target.agent.nodename, via, hops }, 'probe answered');
    return result(hops);
  } catch (err) {
    throw failed('tunnel', toGatewayError(err).message, [{ hop: 'find', ms: find }], toGatewayError(err).code);
  } finally {
    deadline.clear();
    stream.destroy();
  }
}

/** The ProbeReport lines after the answer: a peer's first when there is one, then the agent's; the end after them. */
async function readReports(stream: Duplex, timeoutMs: number): Promise<ProbeReport[]> {
  const out: ProbeReport[] = [];
  for (let i = 0; i < 2; i++) {
    let line: string;
    try {
      line = await readLine(stream, { maxBytes: PROBE_REPORT_MAX_BYTES, timeoutMs, what: 'probe report' });
    } catch (err) {
      if (out.length === 0) throw new GatewayError('GW_ERR_TUNNEL_PROTOCOL', `the agent sent no probe report (an agent of an earlier version dials as for a user): ${toGatewayError(err).message}`);
      throw err;
    }
    const report = reportOf(line);
    out.push(report);
    if (report.hop === 'resource') return out;
  }
  throw new GatewayError('GW_ERR_TUNNEL_PROTOCOL', 'the probe reports named no resource hop');
}

function reportOf(line: string): ProbeReport {
  let r: Partial<ProbeReport>;
  try {
    r = JSON.parse(line) as Partial<ProbeReport>;
  } catch {
    throw new GatewayError('GW_ERR_TUNNEL_PROTOCOL', 'a probe report is not JSON');
  }
  if ((r?.hop !== 'resource' && r?.hop !== 'peer-tunnel') || typeof r.ms !== 'number' || !Number.isFinite(r.ms) || r.ms < 0) {
    throw new GatewayError('GW_ERR_TUNNEL_PROTOCOL', 'a probe report is not {hop, ms}');
  }
  return { hop: r.hop, ms: r.ms, ...(typeof r.detail === 'string' ? { detail: r.detail.slice(0, 200) } : {}) };
}

/**
 * Each hop's time from what this Proxy measured (find, the whole dial) and what the path reported: a peer's dial
 * of its tunnel (agent included), the agent's connect. A remote figure larger than the local one that contains it
 * (clocks are per host; timers are coarse) is capped, so no hop is negative.
 */
export function hopTimes(find: number, dial: number, reports: readonly ProbeReport[]): HopTime[] {
  const resource = reports.find((r) => r.hop === 'resource');
  const peerTunnel = reports.find((r) => r.hop === 'peer-tunnel');
  const r = Math.min(resource?.ms ?? 0, dial);
  const hops: HopTime[] = [{ hop: 'find', ms: find }];
  if (peerTunnel) {
    const p = Math.min(Math.max(peerTunnel.ms, r), dial);
    hops.push({ hop: 'peer', ms: dial - p }, { hop: 'tunnel', ms: p - r });
  } else {
    hops.push({ hop: 'tunnel', ms: dial - r });
  }
  hops.push({ hop: 'resource', ms: r, ...(resource?.detail ? { detail: resource.detail } : {}) });
  return hops;
}

function record(kind: string, hops: readonly HopTime[], ok: boolean): void {
  probeSuccess.set({ kind }, ok ? 1 : 0);
  if (!ok) return;
  for (const h of hops) probeHopSeconds.set({ kind, hop: h.hop }, h.ms / 1000);
  probeHopSeconds.set({ kind, hop: 'total' }, hops.reduce((sum, h) => sum + h.ms, 0) / 1000);
}

/** One deadline for several steps: race() rejects with GW_ERR_TUNNEL_TIMEOUT once it has passed. */
function deadlineAfter(ms: number): { race<T>(p: Promise<T>): Promise<T>; clear(): void } {
  let timer: NodeJS.Timeout | undefined;
  const expired = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new GatewayError('GW_ERR_TUNNEL_TIMEOUT', `no answer within the probe's deadline (${Math.round(ms)} ms left of it)`)), Math.max(0, ms));
  });
  expired.catch(() => undefined);
  return {
    race: <T>(p: Promise<T>) => {
      // A dial that answers after the deadline: its stream is destroyed, never left open.
      p.then((v) => {
        if (timer === undefined && v && typeof (v as unknown as Duplex).destroy === 'function') (v as unknown as Duplex).destroy();
      }, () => undefined);
      return Promise.race([p, expired]);
    },
    clear: () => {
      clearTimeout(timer);
      timer = undefined;
    },
  };
}

/**
 * GET /v1/probe?kind=&name= on the web port, before the Auth API router: the caller is its client certificate, a
 * user's, resolved as it stands now (removed or locked: refused). Other requests go on to `next`.
 */
export function probeRoute(auth: Pick<ProxyAuth, 'resolveCaller' | 'rolesOf'> & ClusterTrust, router: ProbeContext['router'], next: http.RequestListener): http.RequestListener {
  return (req, res) => {
    const url = new URL(req.url ?? '/', 'https://probe.invalid');
    if (url.pathname !== PROBE_PATH) return next(req, res);
    req.resume();
    const answer = async (): Promise<ProbeResult> => {
      if (req.method !== 'GET') throw new GatewayError('GW_ERR_API_METHOD_NOT_ALLOWED', `${PROBE_PATH} takes GET`);
      const certified = peerIdentity(auth, req);
      if (certified.kind !== 'user' && certified.kind !== 'admin') throw new GatewayError('GW_ERR_ACCESS_DENIED', 'only users (and the local admin identity) may probe');
      const identity = await auth.resolveCaller(certified);
      const kind = url.searchParams.get('kind') ?? '';
      const name = url.searchParams.get('name') ?? '';
      if (name === '' || name.length > 253) throw new GatewayError('GW_ERR_USAGE', 'probe: give the resource\'s name (at most 253 characters)');
      return runProbe({ auth, router }, identity, kind, name);
    };
    answer().then(
      (result) => sendJson(res, 200, result),
      (err: unknown) => sendWebError(res, err),
    );
  };
}

/** The probe's path on the web port (the wire contract with gwctl). */
export const PROBE_PATH = '/v1/probe';
