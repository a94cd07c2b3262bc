// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.30;

/// The part of ERC-20 the escrow uses.
interface IERC20 {
    function transfer(address to, uint256 amount) external returns (bool);
    function transferFrom(address from, address to, uint256 amount) external returns (bool);
}

/// Buyers' deposits and providers' payouts for sharemesh (SPEC.md §13).
///
/// A buyer deposits a stablecoin. For each provider it deals with, the buyer's node
/// signs (EIP-712) a `SpendingAuth`: the cumulative amount it has ever authorised that
/// provider, which the buyer's node keeps equal to the provider's final (past the
/// dispute window, never voided) receipts. The provider redeems the newest one whenever
/// it likes: the contract pays the difference to what it already paid on that channel,
/// at most what the deposit holds. A buyer's money leaves only after a notice period
/// (longer than the nodes' dispute window) during which providers can still redeem.
contract SharemeshEscrow {
    IERC20 public immutable token;
    /// Seconds between asking to withdraw and being able to.
    uint64 public immutable noticeSeconds;

    bytes32 private constant DOMAIN_TYPEHASH =
        keccak256("EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)");
    bytes32 private constant NAME_HASH = keccak256("sharemesh escrow");
    bytes32 private constant VERSION_HASH = keccak256("1");
    bytes32 public constant SPENDING_AUTH_TYPEHASH =
        keccak256("SpendingAuth(address buyer,address provider,uint256 cumulative)");
    /// secp256k1's n / 2: signatures with a larger `s` are the malleable twin.
    uint256 private constant HALF_ORDER = 0x7fffffffffffffffffffffffffffffff5d576e7357a4501ddfe92f46681b20a0;

    struct Account {
        uint256 balance;
        uint256 withdrawalAmount;
        uint64 withdrawableAt;
    }

    mapping(address => Account) public accounts;
    /// What each (buyer, provider) channel has paid out, cumulatively.
    mapping(address => mapping(address => uint256)) public redeemed;

    event Deposited(address indexed buyer, uint256 amount, uint256 balance);
    event WithdrawalRequested(address indexed buyer, uint256 amount, uint64 withdrawableAt);
    event Withdrawn(address indexed buyer, uint256 amount);
    event Redeemed(address indexed buyer, address indexed provider, uint256 cumulative, uint256 paid);

    error ZeroAmount();
    error TokenTransferFailed();
    error NothingToWithdraw();
    error NoticeRunning(uint64 withdrawableAt);
    error BadSignature();
    error AlreadyRedeemed(uint256 redeemed);
    error DepositEmpty();

    constructor(IERC20 token_, uint64 noticeSeconds_) {
        token = token_;
        noticeSeconds = noticeSeconds_;
    }

    /// Computed on every call, so a signature made for one chain never verifies on a fork
    /// with another chain id.
    function domainSeparator() public view returns (bytes32) {
        return keccak256(abi.encode(DOMAIN_TYPEHASH, NAME_HASH, VERSION_HASH, block.chainid, address(this)));
    }

    function deposit(uint256 amount) external {
        if (amount == 0) revert ZeroAmount();
        Account storage account = accounts[msg.sender];
        account.balance += amount;
        if (!token.transferFrom(msg.sender, address(this), amount)) revert TokenTransferFailed();
        emit Deposited(msg.sender, amount, account.balance);
    }

    /// Starts (or restarts) the notice period for `amount`; providers keep redeeming
    /// against the whole balance until the withdrawal is made.
    function requestWithdrawal(uint256 amount) external {
        if (amount == 0) revert ZeroAmount();
        Account storage account = accounts[msg.sender];
        account.withdrawalAmount = amount;
        account.withdrawableAt = uint64(block.timestamp) + noticeSeconds;
        emit WithdrawalRequested(msg.sender, amount, account.withdrawableAt);
    }

    /// Pays out the requested amount, or what redemptions during the notice left.
    function withdraw() external returns (uint256 amount) {
        Account storage account = accounts[msg.sender];
        if (account.withdrawableAt == 0) revert NothingToWithdraw();
        if (block.timestamp < account.withdrawableAt) revert NoticeRunning(account.withdrawableAt);
        amount = account.withdrawalAmount < account.balance ? account.withdrawalAmount : account.balance;
        account.balance -= amount;
        account.withdrawalAmount = 0;
        account.withdrawableAt = 0;
        if (amount == 0) revert NothingToWithdraw();
        if (!token.transfer(msg.sender, amount)) revert TokenTransferFailed();
        emit Withdrawn(msg.sender, amount);
    }

    /// The EIP-712 digest the buyer signs.
    function spendingAuthDigest(address buyer, address provider, uint256 cumulative) public view returns (bytes32) {
        bytes32 structHash = keccak256(abi.encode(SPENDING_AUTH_TYPEHASH, buyer, provider, cumulative));
        return keccak256(abi.encodePacked("\x19\x01", domainSeparator(), structHash));
    }

    /// The caller redeems `buyer`'s authorisation of `cumulative` on the caller's channel:
    /// it is paid what the channel has not paid yet, at most the buyer's balance. An
    /// older authorisation than one already redeemed pays nothing and reverts.
    function redeem(address buyer, uint256 cumulative, uint8 v, bytes32 r, bytes32 s) external returns (uint256 paid) {
        address provider = msg.sender;
        if (uint256(s) > HALF_ORDER || (v != 27 && v != 28)) revert BadSignature();
        address signer = ecrecover(spendingAuthDigest(buyer, provider, cumulative), v, r, s);
        if (signer == address(0) || signer != buyer) revert BadSignature();
        uint256 already = redeemed[buyer][provider];
        if (cumulative <= already) revert AlreadyRedeemed(already);
        Account storage account = accounts[buyer];
        uint256 owed = cumulative - already;
        paid = owed < account.balance ? owed : account.balance;
        if (paid == 0) revert DepositEmpty();
        redeemed[buyer][provider] = already + paid;
        account.balance -= paid;
        if (!token.transfer(provider, paid)) revert TokenTransferFailed();
        emit Redeemed(buyer, provider, cumulative, paid);
    }
}
