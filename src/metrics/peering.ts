/**
 * Peering metrics (src/proxy/peer.ts), on both sides. Asking: the streams this Proxy opened through each peer
 * Proxy, by outcome (ok, or the error's stable code: GW_ERR_PEER_UNREACHABLE, GW_ERR_PEER_PROTOCOL, ...), and the
 * streams it carries through each now. Serving: the streams it served for each peer (the asking Proxy), by the
 * same outcomes (a bad request, an agent it holds no tunnel of, a peer refused mid-session), and those open now. A peer is named by its host ID (a UUID, bounded by the cluster's Proxies and capped in
 * define.ts), never by its address: addresses change and are unbounded.
 */
import { ERROR_CODES } from '../errors.js';
import { counter, gauge, HOST_ID } from './define.js';

const AREA = 'peering';
const streams = counter({
  name: 'gateway_peer_streams_total',
  help: "Streams opened through a peer Proxy (peer: its host ID), by outcome (ok or the error code); failures show a peer that cannot be reached.",
  area: AREA,
  labels: { peer: HOST_ID, outcome: ['ok', ...Object.keys(ERROR_CODES)] },
});

const clients = new Set<() => Iterable<[string, number]>>();
const open = gauge({
  name: 'gateway_peer_streams_open',
  help: 'Streams carried through a peer Proxy now (peer: its host ID).',
  area: AREA,
  labels: { peer: HOST_ID },
  collect: () => {
    open.metric.reset();
    for (const read of clients) for (const [peer, n] of read()) open.set({ peer }, n);
  },
});

const served = counter({
  name: 'gateway_peer_streams_served_total',
  help: "Streams this Proxy served for a peer Proxy on its peering listener (peer: the asking Proxy's host ID), by outcome (ok or the error code it answered).",
  area: AREA,
  labels: { peer: HOST_ID, outcome: ['ok', ...Object.keys(ERROR_CODES)] },
});
const servedOpen = gauge({ name: 'gateway_peer_streams_served_open', help: "Streams this Proxy serves for a peer Proxy now (peer: the asking Proxy's host ID).", area: AREA, labels: { peer: HOST_ID } });

/**
 * The peering listener answered a stream of peer (its host ID, read from its checked certificate). An ok stream
 * counts as open until the function returned is called (once; later calls do nothing).
 */
export function recordPeerServed(peer: string, outcome: string): () => void {
  served.inc({ peer, outcome });
  if (outcome !== 'ok') return () => undefined;
  const child = servedOpen.with({ peer });
  child.inc();
  let done = false;
  return () => {
    if (done) return;
    done = true;
    child.dec();
  };
}

export function recordPeerStream(peer: string, outcome: string): void {
  streams.inc({ peer, outcome });
}

/** A peering client: read gives its streams per peer now (at a scrape). Returns the unregister. */
export function watchPeerClient(read: () => Iterable<[string, number]>): () => void {
  clients.add(read);
  return () => clients.delete(read);
}
