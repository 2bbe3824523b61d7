/**
 * The agent's one span per dial: `agent.dial`, a child of the Proxy's span the DialRequest carries (trusted: the
 * request came over a tunnel or a direct listener whose peer is a verified Proxy of this cluster, so the Proxy's
 * sampling decision is followed). Both ways a Proxy reaches an agent start it here (src/agent/tunnel.ts for a
 * reverse tunnel's channel, src/agent/direct.ts for a direct-join listener), so the two record the same hop the
 * same way. It times the dial to the resource, not the session; the caller ends it.
 */
import { startHop, traceContextOf, type HopSpan } from '../trace.js';
import type { DialRequest } from '../tunnel/protocol.js';

/** Starts the agent.dial span of one DialRequest (its fields are untrusted input: bounded before they are set). */
export function startAgentDial(request: DialRequest, hostId: string): HopSpan {
  return startHop('agent.dial', {
    kind: 'server',
    parent: traceContextOf(request),
    trusted: true,
    attributes: { 'gateway.service': String(request.service).slice(0, 16), 'gateway.resource': String(request.resource).slice(0, 256), 'gateway.agent.host_id': hostId },
  });
}
