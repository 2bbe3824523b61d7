/**
 * The one Prometheus registry of the process (prom-client). Every metric the gateway records is registered here,
 * not in prom-client's global default register, so a test or a second daemon in one process can read or reset
 * exactly the gateway's series, and the diagnostics listener (gateway.diag_addr) serves exactly this registry.
 * A leaf: the transport, the roles and the daemon all record into it, so it imports nothing of the project.
 */
import { Registry } from 'prom-client';

export const registry = new Registry();
