/**
 * The probe's series (`gwctl probe`, src/proxy/probe.ts): the last probe's time per hop, and whether it got
 * through, per resource kind. Labels are bounded on purpose: the kind (node, db, app, kube, desktop) and the hop
 * (find, peer, tunnel, resource, total), never a resource's name (unbounded, and names can say more than an
 * operator wants on a dashboard) nor a user or an address. Which resource was probed last is in the Proxy's log.
 */
import { Gauge } from 'prom-client';
import { registry } from './registry.js';

export const probeHopSeconds = new Gauge({
  name: 'gateway_probe_hop_seconds',
  help: 'Time of each hop of the last probe (gwctl probe) of a resource of this kind, in seconds.',
  labelNames: ['kind', 'hop'] as const,
  registers: [registry],
});

export const probeSuccess = new Gauge({
  name: 'gateway_probe_success',
  help: 'Whether the last probe of a resource of this kind got through (1) or not (0).',
  labelNames: ['kind'] as const,
  registers: [registry],
});
