// Fixed identifiers of the demo data set (design §5): the development issuer signs tokens for these
// subjects and the seed maps them to companies and sites. Fixed so tokens, seed and tests agree.

/** Keycloak-style `sub` claims (UUIDs) of the demo users. */
export const demoUserSubs = {
  /** Acme Facilities, all its sites. */
  alice: '0b0a11ce-0000-4000-8000-00000000a11c',
  /** Acme Facilities, one site (Acme HQ). */
  bob: '0b0a11ce-0000-4000-8000-000000000b0b',
  /** Borealis Estates, all its sites. */
  carol: '0b0a11ce-0000-4000-8000-00000000ca01',
  /** Signed in, mapped to nothing: sees nothing. */
  dave: '0b0a11ce-0000-4000-8000-00000000da1e',
} as const;

export type DemoUser = keyof typeof demoUserSubs;

export const demoCompanies = {
  acme: { id: 'c0000000-0000-4000-8000-00000000ac3e', name: 'Acme Facilities' },
  borealis: { id: 'c0000000-0000-4000-8000-0000000b0ea1', name: 'Borealis Estates' },
} as const;

export interface DemoSite {
  id: string;
  companyId: string;
  name: string;
  city: string;
  address: string;
  postalCode: string;
  timezone: string;
}

const acme = demoCompanies.acme.id;
const borealis = demoCompanies.borealis.id;

/** Demo sites; the gateway's demo devices (acme-hq-*) belong to `acmeHq`. */
export const demoSites = {
  acmeHq: {
    id: '5e000000-0000-4000-8000-000000000a01',
    companyId: acme,
    name: 'Acme HQ',
    city: 'Chicago',
    address: '233 S Wacker Dr',
    postalCode: '60606',
    timezone: 'America/Chicago',
  },
  acmeWarehouse: {
    id: '5e000000-0000-4000-8000-000000000a02',
    companyId: acme,
    name: 'Acme Distribution Center',
    city: 'Joliet',
    address: '2400 Channahon Rd',
    postalCode: '60436',
    timezone: 'America/Chicago',
  },
  acmeLab: {
    id: '5e000000-0000-4000-8000-000000000a03',
    companyId: acme,
    name: 'Acme Research Lab',
    city: 'Madison',
    address: '1 Science Ct',
    postalCode: '53711',
    timezone: 'America/Chicago',
  },
  borealisTower: {
    id: '5e000000-0000-4000-8000-000000000b01',
    companyId: borealis,
    name: 'Borealis Tower',
    city: 'Toronto',
    address: '100 King St W',
    postalCode: 'M5X 1A9',
    timezone: 'America/Toronto',
  },
  borealisMall: {
    id: '5e000000-0000-4000-8000-000000000b02',
    companyId: borealis,
    name: 'Borealis Commons Mall',
    city: 'Ottawa',
    address: '50 Rideau St',
    postalCode: 'K1N 9J7',
    timezone: 'America/Toronto',
  },
  borealisDepot: {
    id: '5e000000-0000-4000-8000-000000000b03',
    companyId: borealis,
    name: 'Borealis Service Depot',
    city: 'Montreal',
    address: '700 Rue Wellington',
    postalCode: 'H3C 3S4',
    timezone: 'America/Toronto',
  },
} as const satisfies Record<string, DemoSite>;

export type DemoSiteName = keyof typeof demoSites;

/** Which demo sites each demo user may see (what the seed's access map says). */
export const demoAccess: Record<DemoUser, readonly DemoSiteName[]> = {
  alice: ['acmeHq', 'acmeWarehouse', 'acmeLab'],
  bob: ['acmeHq'],
  carol: ['borealisTower', 'borealisMall', 'borealisDepot'],
  dave: [],
};
