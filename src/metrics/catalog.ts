/**
 * Every area's metrics, loaded: what the docs' metrics table is rendered from and what the label-bound test checks
 * a scrape against (DECLARED is filled as each area's file is imported). The daemon needs none of this: each hook
 * imports its own area's file.
 */
import './backend.js';
import './certs.js';
import './dials.js';
import './listeners.js';
import './peering.js';
import './ratelimit.js';
import './tunnels.js';
import './upgrade.js';
import './artifacts.js';
import './autoupdate.js';
import './e2e.js';

export { DECLARED, inSet, OTHER, type LabelSet, type MetricSpec, type PatternSet } from './define.js';
export { DEFAULT_LABELS, PROCESS_PREFIX } from './process.js';
