/**
 * gateway-upgrade run with zypper, for real: the suite of test/upgrade/rpm-suite.ts (N -> N+1 inside a window, refused
 * outside it, a critical release at once, rollback, a new major version announced, stable/rolling; hostile: corrupt
 * metadata, a package whose checksum does not match, a version that does not exist) with zypper installing into a
 * temporary root (GATEWAY_UPGRADE_PM_ARGS=--root <root>).
 */
import { rpmUpgradeSuite } from './rpm-suite.js';

rpmUpgradeSuite('zypper');
