/**
 * End-to-end stream metrics at the Proxy (src/proxy/e2egrants.ts, e2erelay.ts, e2edata.ts): the grants it answered
 * by outcome (ok, classic: the client takes the classic route, refused), the pass-through streams by outcome
 * (opened, or why not), the bytes it relayed without decrypting them, the agents' data connections it refused by
 * reason, and the idle data connections it holds. Every label is a closed list: no user, resource or address.
 */
import { counter, gauge } from './define.js';

const AREA = 'end-to-end streams';

export type GrantOutcome = 'ok' | 'classic' | 'refused';
const grants = counter({
  name: 'gateway_e2e_grants_total',
  help: 'Grant requests for end-to-end streams this Proxy answered, by outcome: ok (a grant), classic (the agent takes no end-to-end stream here: the client uses the classic route), refused (as the classic route would refuse it).',
  area: AREA,
  labels: { outcome: ['ok', 'classic', 'refused'] },
});

export type StreamOutcome = 'opened' | 'tunnel-stream' | 'forwarded' | 'grant' | 'revoked' | 'no-tunnel' | 'no-data';
const streams = counter({
  name: 'gateway_e2e_streams_total',
  help: "End-to-end streams on the pass-through route, by outcome: opened (spliced onto an agent's data connection), tunnel-stream (none waited here: spliced onto a stream of the agent's tunnel, end to end all the same), forwarded (relayed raw to the peering listener of a peer Proxy that holds the agent's tunnel: Proxy peering), grant (a bad line, a grant forged, expired or routed before, an issuer that is no live Proxy: GW_ERR_E2E_GRANT), revoked (the grant's user is locked or removed now), no-tunnel (the grant's agent has no tunnel here now), no-data (no idle data connection within the wait, for an agent that takes no stream on its tunnel).",
  area: AREA,
  labels: { outcome: ['opened', 'tunnel-stream', 'forwarded', 'grant', 'revoked', 'no-tunnel', 'no-data'] },
});

const bytes = counter({
  name: 'gateway_e2e_bytes_total',
  help: 'Bytes of end-to-end streams this Proxy relayed without decrypting them, by direction (in: client to agent, out: agent to client).',
  area: AREA,
  labels: { direction: ['in', 'out'] },
});

export type DataRefusal = 'bad-preamble' | 'timeout' | 'unknown-tunnel' | 'bad-mac' | 'reused' | 'pool-full' | 'bytes-while-idle';
const dataRefused = counter({
  name: 'gateway_e2e_data_refused_total',
  help: "Agents' data connections this Proxy closed, by reason (GW_ERR_E2E_DATA): bad-preamble, timeout (no preamble within its deadline), unknown-tunnel (no pair of the preamble names a tunnel here: an agent holds no tunnel to this Proxy through the address it dialled), bad-mac, reused (a number used before on the tunnel), pool-full (twice the tunnel's pool idle here already: its pool and a balancer's spares), bytes-while-idle.",
  area: AREA,
  labels: { reason: ['bad-preamble', 'timeout', 'unknown-tunnel', 'bad-mac', 'reused', 'pool-full', 'bytes-while-idle'] },
});

const sources = new Set<() => number>();
const idle = gauge({
  name: 'gateway_e2e_data_idle',
  help: "Agents' idle data connections this Proxy holds for end-to-end streams now.",
  area: AREA,
  collect: () => {
    let n = 0;
    for (const read of sources) n += read();
    idle.metric.set(n);
  },
});

export function recordGrant(outcome: GrantOutcome): void {
  grants.inc({ outcome });
}

export function recordE2EStream(outcome: StreamOutcome): void {
  streams.inc({ outcome });
}

/** The counters a relayed stream adds its bytes to (kept per stream: one lookup, not one per chunk). */
export function e2eByteCounters(): { in: { inc(n: number): void }; out: { inc(n: number): void } } {
  return { in: bytes.with({ direction: 'in' }), out: bytes.with({ direction: 'out' }) };
}

export function recordDataRefused(reason: DataRefusal): void {
  dataRefused.inc({ reason });
}

/** A data registry: read gives its idle connections now (at a scrape). Returns the unregister. */
export function watchIdleData(read: () => number): () => void {
  sources.add(read);
  return () => void sources.delete(read);
}
