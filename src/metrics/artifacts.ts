/**
 * The Proxy's relay of release artifacts (src/proxy/artifacts.ts): requests by route and outcome (a cache hit, a
 * miss that fetched, a request that joined a fetch already under way, and the refusals and failures), bytes by where
 * they came from, what the cache holds now and what it evicted. Every label is a closed set: never a path or a name.
 */
import { counter, gauge } from './define.js';

export const ARTIFACT_ROUTES = ['artifacts', 'repo'] as const;
export const ARTIFACT_OUTCOMES = ['hit', 'miss', 'shared', 'not_found', 'refused', 'failed', 'busy'] as const;
export type ArtifactOutcome = (typeof ARTIFACT_OUTCOMES)[number];

const AREA = 'artifacts';
const requests = counter({
  name: 'gateway_proxy_artifact_requests_total',
  help: "Requests to the Proxy's artifact and repository routes, by route and outcome (hit: served from the cache; miss: fetched from the upstream; shared: joined a fetch under way; not_found, refused: a path the relay does not take, failed: the upstream failed or cut, busy: too many fetches at once).",
  area: AREA,
  labels: { route: ARTIFACT_ROUTES, outcome: ARTIFACT_OUTCOMES },
});
const bytes = counter({
  name: 'gateway_proxy_artifact_bytes_total',
  help: 'Bytes of artifacts: read from the upstream (upstream) and sent to clients (served).',
  area: AREA,
  labels: { direction: ['upstream', 'served'] },
});
const cacheBytes = gauge({ name: 'gateway_proxy_artifact_cache_bytes', help: "Bytes the Proxy's artifact cache holds now (at most cache_max_bytes).", area: AREA });
const evictions = counter({ name: 'gateway_proxy_artifact_evictions_total', help: 'Cached artifacts removed to stay under cache_max_bytes (least recently used first).', area: AREA });

export const artifactMetrics = {
  request: (route: (typeof ARTIFACT_ROUTES)[number], outcome: ArtifactOutcome) => requests.inc({ route, outcome }),
  upstreamBytes: (n: number) => bytes.inc({ direction: 'upstream' }, n),
  servedBytes: (n: number) => bytes.inc({ direction: 'served' }, n),
  cacheBytes: (n: number) => cacheBytes.set({}, n),
  evicted: () => evictions.inc({}),
};
